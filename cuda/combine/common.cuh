// What the combine kernels share: their parameters and where a token's
// partial from each rank lives.
#pragma once

#include <stdint.h>

#include "common/kernel_common.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

struct CombineParams {
  KernelContext ctx;
  CombineLaunch args;
  int32_t chunk_rows;  // rows per publication phase, combine_phase_rows()
  int32_t phases;      // publication phases of every call (a constant of the handle)
};

// The reduce moves 32 lanes x 4 vectors per step and source (2 KiB).
constexpr int kReduceVectorsPerLane = 4;
constexpr int kReduceSegmentBytes = 32 * kReduceVectorsPerLane * 16;

// Vector loads and stores: partials and output rows 16-byte aligned, and
// with the FP8 wire 8 codes per lane that never cross the row's end.
__device__ __forceinline__ bool combine_rows_aligned(const CombineParams& p) {
  const GroupShape& s = p.ctx.shape;
  // (A wire row is always a multiple of 16 bytes.)
  return s.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.expert_output) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.args.output) % 16 == 0 && (s.combine_wire == 0 || s.hidden_size % 8 == 0);
}

__device__ __forceinline__ int reduce_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_row_bytes + kReduceSegmentBytes - 1) / kReduceSegmentBytes)
                 : 1;
}

// Where the partial of local token `token` from rank q lives (q's slot known):
// this rank's own in its expert_output (with the FP8 wire: its quantized
// rows); a peer's in this rank's combine_in
// (pushed there), or, on the pull path, in the peer's combine_input view (a
// zero-copy workspace has no combine_in).
__device__ __forceinline__ const char* partial_row(const CombineParams& p, int q, int32_t slot) {
  const KernelContext& c = p.ctx;
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row_bytes = c.shape.combine_partial_bytes;
  if (q == c.shape.rank) {
    return static_cast<const char*>(p.args.expert_output) + (c.shape.rank * tpr + slot) * row_bytes;
  }
  if (p.args.pull) {
    return c.rank_base(q) + c.offsets.combine_input + (c.shape.rank * tpr + slot) * row_bytes;
  }
  return c.state.local_base + c.offsets.combine_in + (c.combine_segment(q, c.shape.rank) * tpr + slot) * row_bytes;
}

// The pull schedule (CombineLaunch::pull): its own kernel, combine/pull.cu.
cudaError_t launch_combine_pull(const CombineParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
