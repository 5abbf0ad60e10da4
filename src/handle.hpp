// The object behind moe_ep_handle_t: the group's layout, its backend, the
// dispatch/combine call sequence, and the result views handed to the caller.
#pragma once

#include <memory>
#include <vector>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "collective_step.hpp"
#include "handle_health.hpp"
#include "moe_ep_c.h"
#include "params.hpp"
#include "store/membership_change.hpp"

namespace moe_ep {

// The state of one buffer slot (docs/overlap.md, "The in-flight rules").
enum class SlotState { idle, dispatch_sent, dispatched, combine_sent };

// One dispatch/combine pair's place in the handle: its state, the dispatch it
// belongs to, and the shapes of its result views.
struct PairSlot {
  SlotState state = SlotState::idle;
  DispatchCall dispatch;  // pointers into caller memory are not kept
  // Storage for the shapes of the result views (docs/semantics.md §3: owned by the handle).
  int64_t shape_hidden[3]{}, shape_ids[2]{}, shape_weights[2]{}, shape_scales[3]{};
  int64_t shape_recv_counts[1]{}, shape_local_expert_counts[1]{}, shape_eplb[2]{};
  int64_t shape_output[2]{};
  int64_t shape_combine_input[3]{};
  int64_t shape_expert_counts[1]{}, shape_expert_offsets[1]{}, shape_row_sources[2]{}, shape_row_weights[1]{};
  int64_t shape_dropped_pairs[1]{};
  // The slot's combine_input region (the same every dispatch), NULL unless
  // config.zero_copy_combine or before the slot's first dispatch.
  void* combine_input = nullptr;
};

}  // namespace moe_ep

struct moe_ep_handle_s {
  moe_ep::Layout layout;
  moe_ep_config_t config{};
  std::unique_ptr<moe_ep::Backend> backend;

  // config.micro_batches slots, each one dispatch/combine pair in flight; the
  // one owner of the in-flight rules (handle.cpp).
  std::vector<moe_ep::PairSlot> slots;

  // A timeout, a CUDA failure or an internal error makes the handle unusable;
  // later calls return it (handle_health.hpp).
  moe_ep::HandleHealth health;

  // The active-rank mask (docs/semantics.md, "Active ranks"): 1 active, 0 not;
  // all ranks active at create.  mask_epoch counts the updates.
  std::vector<uint8_t> active;
  uint64_t mask_epoch = 0;

  // failure_policy MASK (handle_failure.hpp): the backend's mask as it last
  // left it (a failure changes it inside a call), the rank most recently
  // masked out after a failure (-1 if none), and config's store strings
  // (config's pointers are not kept).
  std::shared_ptr<moe_ep::MembershipState> mask_state;
  int32_t last_failed_rank = -1;
  std::string store_address, store_prefix;
};

namespace moe_ep {

// moe_ep_is_platform_supported: whether NVLINK_TWO_SIDED can run on `device`
// (-1 = current).  Local.
bool is_platform_supported(int32_t device);

// moe_ep_workspace_size: the bytes create would allocate per rank, for the
// backend create would choose on this rank.  Local, no allocation.
uint64_t workspace_size(const moe_ep_params_t* params, const moe_ep_config_t* config, int32_t world_size);

// The calls on a handle.  dispatch, combine and poll_async_error are refused
// once the handle is broken, and a sticky failure breaks it (HandleHealth).
moe_ep_handle_s* create_handle(const moe_ep_bootstrap_t* bootstrap, const moe_ep_params_t* params,
                               const moe_ep_config_t* config);
void dispatch(moe_ep_handle_s& h, const moe_ep_dispatch_args_t* args,
              moe_ep_dispatch_result_t* result, void* stream);
void combine(moe_ep_handle_s& h, const moe_ep_tensor_t* expert_output, const moe_ep_tensor_t* output,
             moe_ep_combine_result_t* result, void* stream);
// The split phases on buffer slot `slot` (docs/overlap.md).
void dispatch_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_dispatch_args_t* args, void* stream);
void dispatch_recv(moe_ep_handle_s& h, int32_t slot, moe_ep_dispatch_result_t* result, void* stream);
void combine_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* expert_output, void* stream);
void combine_recv(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* output, moe_ep_combine_result_t* result,
                  void* stream);
moe_ep_status_t poll_async_error(moe_ep_handle_s& h);
int32_t backend_of(const moe_ep_handle_s& h);
// moe_ep_poll_health: host state only, never blocks; the message of a
// failure goes to the thread's last error.
moe_ep_health_t poll_health(moe_ep_handle_s& h);
// moe_ep_get_active_ranks / moe_ep_set_active_ranks (the latter collective).
void get_active_ranks(const moe_ep_handle_s& h, uint8_t* active, int32_t world_size);
void set_active_ranks(moe_ep_handle_s& h, const uint8_t* active, int32_t world_size);
// The path of the last call of `phase` (MOE_EP_PHASE_*, checked by the caller).
int32_t last_path_of(const moe_ep_handle_s& h, int32_t phase);
void destroy_handle(moe_ep_handle_s* h) noexcept;
// The values every rank of a group must hold alike (create's parameter check,
// and what a rejoining process must match).
std::vector<RankValue> group_fingerprint(const moe_ep_handle_s& h);

}  // namespace moe_ep
