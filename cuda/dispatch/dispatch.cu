// Dispatch: one kernel per call.  General kernel: every block
//   1. takes its logical index L from a ticket and routes only its own tokens
//      (share L, in order): their slots among themselves on every destination,
//      their picks into the rank's per-expert histogram, their bad ids;
//   2. publishes its count per destination and reads those of blocks
//      0 .. L - 1 (a decoupled look-back, dispatch/lookback.h): its tokens go
//      after theirs, so a token's slot on a destination is the number of
//      earlier local tokens bound there (ascending source order,
//      deterministic, no count exchange before the data); calls the host
//      routes by scan instead (DispatchLaunch::lookback 0: small calls, large
//      grids) skip the look-back: L is the block index, the block scans the
//      tokens up to its last itself, block G - 1 counts every pick;
//   3. writes its tokens' rows, rewritten ids, weights and scales straight into
//      the final receive rows of each destination (row = rank*tpr + slot;
//      with the FP8 dispatch wire, rows encoded on the way where the host
//      chose it: dispatch/quantize_segments.cuh), and
//      its padding rows (ids = invalid, weights = 0): one per own token that
//      does not go there, from the back, and its share of [T, tpr);
//   4. publishes with one release-add per destination (arrival counters).
// A split dispatch's send half (DispatchLaunch::part) ends there, and
// dispatch/receive_kernel.cuh does block 0's last step below.
// The last block (the last ticket, or after a scan the last index) knows the
// totals once it has looked back or scanned: it sends every rank its row
// count, its per-expert counts and this rank's EPLB row before its own
// release.  Block 0, last, waits for every
// rank's arrivals and produces recv_counts and local_expert_counts.  A block
// waits only for blocks that drew an earlier ticket, which are running and
// publish before they wait: no deadlock whatever the residency.
//
// One translation unit: the steps live in the headers of this folder, each
// one concept, and the kernels are instantiated here, at their launch.
#include <stdint.h>

#include <atomic>

#include "common/kernel_launch.cuh"
#include "dispatch/bulk_segments.cuh"
#include "dispatch/general_kernel.cuh"
#include "dispatch/quantize_segments.cuh"
#include "dispatch/receive_kernel.cuh"
#include "dispatch/register_segments.cuh"
#include "dispatch/small_kernel.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

int32_t dispatch_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank, int32_t sm_budget) {
  // About one block per token (rows are large), enough blocks for the padding
  // when few tokens are sent, never more than the SMs the handle may use.
  const int64_t padding_blocks = (static_cast<int64_t>(shape.world_size) * tokens_per_rank + 255) / 256;
  int64_t blocks = num_tokens > padding_blocks ? num_tokens : padding_blocks;
  if (blocks > sm_budget) blocks = sm_budget;
  if (blocks > kMaxDispatchBlocks) blocks = kMaxDispatchBlocks;  // the look-back words' rows
  return blocks < 1 ? 1 : static_cast<int32_t>(blocks);
}

namespace {

// A policy's kernels' shared-memory limit is raised once per device and
// kernel, not on every call (dispatch is on the caller's hot path):
// [small][send half].
template <typename Segments>
std::atomic<uint64_t>* shared_raised(bool small, bool send_half) {
  static std::atomic<uint64_t> raised_on[2][2];
  return &raised_on[small][send_half];
}

template <typename Segments>
void (*dispatch_kernel_for(bool small, bool send_half))(DispatchParams) {
  if (send_half) return small ? dispatch_small_kernel<Segments, true> : dispatch_kernel<Segments, true>;
  return small ? dispatch_small_kernel<Segments, false> : dispatch_kernel<Segments, false>;
}

template <typename Segments>
cudaError_t launch_with(bool small, const DispatchParams& p, cudaStream_t stream) {
  const size_t shared = Segments::kSharedBytes;
  const bool send_half = p.args.part == kPartSend;
  if (shared > 0) {
    const cudaError_t e = raise_dynamic_shared_limit_once(dispatch_kernel_for<Segments>(small, send_half), shared,
                                                          shared_raised<Segments>(small, send_half));
    if (e != cudaSuccess) return e;
  }
  return launch_kernel(dispatch_kernel_for<Segments>(small, send_half), p.args.num_blocks, kBlockThreads, shared,
                       stream, p.args.pdl, p);
}

DispatchParams dispatch_params(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                               const DispatchLaunch& args) {
  DispatchParams p;
  p.ctx.shape = shape;
  p.ctx.offsets = offsets;
  p.ctx.state = state;
  p.args = args;
  return p;
}

}  // namespace

cudaError_t launch_dispatch_receive(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                                    const DispatchLaunch& args, cudaStream_t stream) {
  DispatchParams p = dispatch_params(shape, offsets, state, args);
  p.args.part = kPartReceive;
  p.args.num_blocks = 1;
  return launch_kernel(dispatch_receive_kernel, 1, kBlockThreads, 0, stream, p.args.pdl, p);
}

namespace {

template <typename Segments>
cudaError_t prepare_policy() {
  for (const bool small : {false, true}) {
    for (const bool send_half : {false, true}) {
      const cudaError_t e =
          raise_dynamic_shared_limit_once(dispatch_kernel_for<Segments>(small, send_half), Segments::kSharedBytes,
                                          shared_raised<Segments>(small, send_half));
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t prepare_dispatch(int32_t bulk_rows, int32_t quantize) {
  if (bulk_rows != 0) {
    const cudaError_t e = prepare_policy<BulkSegments>();
    if (e != cudaSuccess) return e;
  }
  return quantize != 0 ? prepare_policy<QuantizeSegments>() : cudaSuccess;
}

cudaError_t launch_dispatch(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                            const DispatchLaunch& args, cudaStream_t stream) {
  const DispatchParams p = dispatch_params(shape, offsets, state, args);
  // The host's path selection (src/nvlink/path_selection.cpp) chose the
  // kernel and the row copies: the FP8 wire encoded in registers, bulk copies
  // (both only for 16-byte aligned rows and sources), or registers (rows of
  // any size).
  const bool small = args.small_batch != 0;
  if (args.quantize != 0) return launch_with<QuantizeSegments>(small, p, stream);
  const bool bulk = args.bulk_rows != 0;
  return bulk ? launch_with<BulkSegments>(small, p, stream) : launch_with<RegisterSegments>(small, p, stream);
}

}  // namespace kernels
}  // namespace moe_ep
