// The interface every transport implements (HOST, NVLINK_TWO_SIDED, NCCL).
// The handle validates arguments, keeps the call sequence and the broken
// state, and creates backends through backend_table.hpp; a backend only moves
// bytes between validated raw pointers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/call_path.hpp"
#include "moe_ep_c.h"

namespace moe_ep {

// One validated dispatch.  Pointers already include byte_offset.
struct DispatchCall {
  int32_t num_tokens = 0;       // T on this rank
  int32_t tokens_per_rank = 0;  // receive rows per source rank
  const void* hidden = nullptr;          // [T, hidden_row_bytes]
  const int32_t* topk_ids = nullptr;     // [T, top_k]
  const float* topk_weights = nullptr;   // [T, top_k]; NULL if absent or T == 0
  bool has_weights = false;              // the caller passed topk_weights (even with T == 0):
                                         // the result then has weights (0 on padding rows)
  const void* scales = nullptr;          // [T, scale_row_bytes] or NULL
  const int32_t* eplb_local = nullptr;   // [num_experts] or NULL
};

// Where a backend left the results of a dispatch (its own memory).
struct DispatchBuffers {
  void* hidden = nullptr;                // [world*tpr, hidden_row_bytes]
  int32_t* topk_ids = nullptr;           // [world*tpr, top_k]
  float* topk_weights = nullptr;         // [world*tpr, top_k]; non-NULL iff call.has_weights
  void* scales = nullptr;                // [world*tpr, scale_row_bytes], NULL if none
  int32_t* recv_counts = nullptr;        // [world]
  int32_t* local_expert_counts = nullptr;// [experts_per_rank]
  int32_t* eplb_gathered = nullptr;      // [world, num_experts], NULL if off
  void* combine_input = nullptr;         // [world*tpr, combine_row_bytes] zero-copy combine
                                         // input region, NULL unless layout.zero_copy_combine
  // Expert layouts (layout.expert_layout()): hidden and scales then hold the
  // expert layout's rows, topk_ids and topk_weights are NULL, combine_input
  // has expert_layout_rows() rows, and these are set (offsets: EXPERT_PACKED).
  int32_t* expert_counts = nullptr;   // [experts_per_rank]
  int32_t* expert_offsets = nullptr;  // [experts_per_rank + 1]
  int32_t* row_sources = nullptr;     // [rows, 3]
  float* row_weights = nullptr;       // [rows]
  int32_t* dropped_pairs = nullptr;   // [1]
};

// One validated combine, for the dispatch that preceded it.
struct CombineCall {
  int32_t num_tokens = 0;         // T of the matching dispatch
  int32_t tokens_per_rank = 0;    // of the matching dispatch
  const void* expert_output = nullptr;  // [layout.combine_rows(tpr), combine_row_bytes]
  void* output = nullptr;               // [T, combine_row_bytes] or NULL = backend-owned
  // expert_output is the combine_input region this backend returned from the
  // matching dispatch (the caller wrote the expert output in place).  A backend
  // may read it from there without staging it; the results must be bitwise the
  // same as for a copy of it.
  bool expert_output_is_workspace = false;
};

// What a backend's host memory says about the group, without touching the
// device or a peer (moe_ep_poll_health).
struct HostHealth {
  moe_ep_status_t status = MOE_EP_SUCCESS;  // a sticky failure the host can see, SUCCESS if none
  int32_t failed_rank = -1;                 // the peer it names, -1 if none
  std::string message;                      // set when status is not SUCCESS
  // The failure is not sticky: failure_policy MASK, where the handle's next
  // call recovers from it (the results of the calls since are invalid).
  bool recoverable = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // Where the caller's tensors must live.
  virtual moe_ep_device_t device() const = 0;
  virtual DispatchBuffers dispatch(const DispatchCall& call, void* stream) = 0;
  // Returns the output pointer (call.output or backend-owned memory).
  virtual void* combine(const CombineCall& call, void* stream) = 0;
  // The split phases (docs/overlap.md), on buffer slot `slot` (validated by
  // the handle, which also owns the per-slot state machine).  A backend that
  // has them returns true from split_phases() and implements all four, and
  // its dispatch and combine are exactly send + receive on slot 0.  The
  // others keep the defaults, which the handle never reaches (it refuses the
  // split calls with UNSUPPORTED first).
  virtual bool split_phases() const { return false; }
  // A backend whose fused calls do less than its two halves (one kernel
  // instead of two, say) returns true: the handle then calls dispatch and
  // combine for the fused calls instead of the halves on slot 0.
  virtual bool fused_calls_are_faster() const { return false; }
  virtual void dispatch_send(int32_t slot, const DispatchCall& call, void* stream);
  virtual DispatchBuffers dispatch_recv(int32_t slot, void* stream);
  virtual void combine_send(int32_t slot, const CombineCall& call, void* stream);
  // Returns the output pointer (`output` or backend-owned memory of the slot).
  virtual void* combine_recv(int32_t slot, void* output, void* stream);
  // First error found on the device since the last poll (SUCCESS if none).
  virtual moe_ep_status_t poll_async_error(std::string* message) = 0;
  // Host-visible device state only: never synchronises, never blocks.  The
  // default, for backends with no host-mapped device state, knows nothing.
  virtual HostHealth host_health() const { return HostHealth{}; }
  // The active-rank mask from the next dispatch on (docs/semantics.md,
  // "Active ranks").  Collective over the group: `local_status` is this
  // rank's outcome of the handle's checks, agreed before anything is
  // exchanged, so a rank that refused fails every rank instead of hanging them.
  // The default accepts only the all-active mask (UNSUPPORTED otherwise).
  virtual void set_active_ranks(const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                                const std::string& local_message);
  // Release everything; collective when the group is healthy, never hangs.
  virtual void shutdown() noexcept = 0;

  // The path of each phase's last call, noted by the backend's dispatch and
  // combine (moe_ep_get_last_path).
  CallPaths paths;
};

}  // namespace moe_ep
