// Runs one workload through a GPU backend's handle and a HOST handle over
// the same bootstrap, on fresh random inputs every round, with the GPU results
// poisoned before each round, and compares every output byte for byte
// (moe_ep_verify's comparison; the HOST backend is checked against the oracle
// by the CPU suites and by moe_ep_conformance).  The GPU handle runs the fused
// calls, the split halves on slot 0, or two micro-batches through slots 0 and
// 1 in an interleaved order (docs/overlap.md); the HOST handle always runs
// each micro-batch as a fused pair.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "device_inputs.hpp"
#include "moe_ep_c.h"
#include "tensor_view.hpp"
#include "workload.hpp"

namespace moe_ep_test {

using moe_ep_verify::RankInputs;
using moe_ep_verify::WorkloadSpec;

// The GPU backend a suite tests: MOE_EP_TEST_GPU_BACKEND=nccl selects
// MOE_EP_BACKEND_NCCL, anything else (or unset) NVLINK_TWO_SIDED.
int32_t gpu_backend_under_test();

// How a round issues its dispatch and combine on the GPU handle.
enum class GpuPhases {
  fused,           // moe_ep_dispatch, moe_ep_combine
  split,           // dispatch_send, dispatch_recv, combine_send, combine_recv on slot 0
  micro_batches2,  // config.micro_batches = 2: micro-batches A and B, each on its own inputs,
                   // their halves interleaved (GpuCaseOptions::interleaving)
};

// The halves of each micro-batch, in order.
enum GpuHalf : int { kDispatchSend = 0, kDispatchRecv = 1, kCombineSend = 2, kCombineRecv = 3 };

// One half of a split round: micro-batch 0 (A) or 1 (B), and which half.
struct GpuStep {
  int micro_batch;
  GpuHalf half;
};

// The half the runner is about to issue (eager split rounds): what a test
// needs to try other calls on the handle at that point.
struct GpuHalfCall {
  moe_ep_handle_t handle;
  int round;
  int micro_batch;  // 0 = A, 1 = B
  int32_t slot;
  int32_t slots;                       // config.micro_batches of the handle
  GpuHalf half;                        // the slot is IDLE before kDispatchSend, DISPATCH_SENT before kDispatchRecv, ...
  const moe_ep_dispatch_args_t* args;  // this micro-batch's dispatch arguments
  const moe_ep_tensor_t* expert_output;  // and its expert output (not the combine_input view)
  void* stream;
};

struct GpuCaseOptions {
  int32_t backend = gpu_backend_under_test();  // compared with the HOST backend
  int rounds = 3;              // dispatch/combine pairs, each on new inputs
  bool caller_output = false;  // combine into the caller's buffer (else library-owned)
  bool graph = false;          // capture dispatch+combine once, replay it every round
  bool zero_copy_combine = false;  // GPU handle with config.zero_copy_combine: the expert output is
                                   // written into the dispatch result's combine_input view, which
                                   // combine then takes (eager rounds only; the HOST oracle takes a copy)
  // With zero_copy_combine: the ranks and rounds for which this returns false
  // pass their own expert_output buffer instead of the view (combine then
  // copies it into the view for the peers); their view is poisoned after the
  // dispatch, so a missed copy shows.  Empty: every rank passes the view.
  std::function<bool(int rank, int round)> zero_copy_passes_view;
  int timeout_ms = 20000;
  int num_sms = 0;
  int device = -1;             // -1 = gpu_device()
  // Edits a rank's inputs after they are drawn (both handles see the edit).
  std::function<void(int rank, RankInputs& inputs)> edit_inputs;
  // Edits a rank's expert output ([P, H] combine_dtype) after it is drawn
  // (both handles see the edit): special values, say.
  std::function<void(int rank, int round, std::vector<uint8_t>& expert_output)> edit_expert_output;
  // Combine outputs compared bit for bit except that any two NaNs of
  // combine_dtype are equal: a sum with a NaN is the hardware's NaN (the GPU's
  // canonical one, the host CPU's quieted operand), not a value the API fixes.
  bool nans_compare_equal = false;
  // Called (eager rounds only) after the GPU dispatch is issued and before its
  // combine: e.g. to run a second handle while this one has a dispatch in flight.
  std::function<void()> between_dispatch_and_combine;

  GpuPhases phases = GpuPhases::fused;
  // With graph and split phases: every run of send halves and every run of
  // receive halves in a graph of its own (so no send shares a graph with its
  // receive), the graphs replayed in order; else one graph holds the round.
  bool graph_per_kind = false;
  // micro_batches2: which micro-batch issues its next half, 0 = A, 1 = B (four
  // of each).  Empty: A.dispatch_send, B.dispatch_send, A.dispatch_recv,
  // A.combine_send, B.dispatch_recv, A.combine_recv, B.combine_send, B.combine_recv.
  std::vector<int> interleaving;
  int32_t slot_of_a = 0;  // micro_batches2: A's slot (B takes the other)
  // micro_batches2: B's local_num_tokens per rank; empty = as the spec says
  // (drawn from B's own seed when the spec leaves them to the seed).
  std::vector<int> second_tokens;
  // Called before each half of an eager split round.
  std::function<void(const GpuHalfCall&)> before_half;
  // The active-rank mask of each round, set on both handles
  // (moe_ep_set_active_ranks) before the round where it changes: with
  // `graph`, between replays of the graph captured in round 0.  Empty:
  // every rank stays active.
  std::function<std::vector<uint8_t>(int round)> active_ranks;

  int32_t micro_batches() const { return phases == GpuPhases::micro_batches2 ? 2 : 1; }
};

// The halves of a split or micro_batches2 round in the order the runner
// issues them (the interleaving); throws for fused phases or a bad interleaving.
std::vector<GpuStep> split_round_steps(const GpuCaseOptions& options);

// Thrown when the GPU backend answers UNSUPPORTED (create with
// micro_batches 2, or a split call), so that a suite can skip instead of fail.
class GpuCaseUnsupported : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Collective over `bootstrap`.  Returns "" when every round matched on this
// rank, else a description of the first differences.
std::string run_gpu_case(const WorkloadSpec& spec, const moe_ep_bootstrap_t& bootstrap, const GpuCaseOptions& options);

// Collective: "" when the backend of `options` runs the split halves with
// options.micro_batches() slots (always "" for fused phases), else its
// UNSUPPORTED message.  Probes with a receive half on an idle slot, which any
// backend with halves refuses as INVALID_STATE before launching anything.
std::string split_phases_unsupported(const WorkloadSpec& spec, const moe_ep_bootstrap_t& bootstrap,
                                     const GpuCaseOptions& options);

// A handle of `backend` for `spec`, configured from the options (timeout,
// SMs, zero-copy combine, micro_batches; the HOST backend takes one slot and
// no zero-copy view), destroyed with the object.  Throws GpuCaseUnsupported
// when create answers UNSUPPORTED, std::runtime_error on any other failure.
class CaseHandle {
 public:
  CaseHandle(const moe_ep_bootstrap_t& b, const WorkloadSpec& spec, int32_t backend, const GpuCaseOptions& o,
             int device);
  ~CaseHandle();
  CaseHandle(const CaseHandle&) = delete;
  CaseHandle& operator=(const CaseHandle&) = delete;
  moe_ep_handle_t get() const { return h_; }
  // Destroys the handle now; returns the seconds destroy took.
  double destroy();

 private:
  moe_ep_handle_t h_ = nullptr;
};

}  // namespace moe_ep_test
