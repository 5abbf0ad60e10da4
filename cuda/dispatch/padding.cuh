// Padding rows (ids = invalid, weights = 0): every row of a destination's
// segment is written in every call, by its token or as padding.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/lookback.h"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Padding rows r in [r0, r1) of this rank's segment on rank d.
__device__ __forceinline__ void pad_rows(const DispatchParams& p, int d, int32_t r0, int32_t r1) {
  const GroupShape& s = p.ctx.shape;
  const int64_t first = (static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + r0) * s.top_k;
  const int n = (r1 - r0) * s.top_k;
  int32_t* ids = p.ctx.remote<int32_t>(d, p.ctx.offsets.recv_ids) + first;
  float* weights = p.ctx.remote<float>(d, p.ctx.offsets.recv_weights) + first;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    ids[i] = s.invalid_expert_id;
    weights[i] = 0.0f;
  }
}

// How many of the tokens [0, t0) and [0, t1) go to one destination.
struct BoundRows {
  int32_t before;   // of [0, t0)
  int32_t through;  // of [0, t1)
};

// Step 3b, both kernels: the padding rows of the block with logical index L
// that owns tokens [t0, t1), on every destination (dispatch/lookback.h): one
// per own token that does not go there, counted from the back of [0, T), and
// its share of [T, tpr).  `bound_of(d)` says how many tokens before and up to
// its own go to d.  No block needs the totals.
template <typename BoundOf>
__device__ void write_block_padding(const DispatchParams& p, int t0, int t1, int32_t logical, const BoundOf& bound_of) {
  const int32_t T = p.args.num_tokens;
  int32_t tail0, tail1;
  block_tail_rows(T, p.args.tokens_per_rank, static_cast<int32_t>(gridDim.x), logical, &tail0, &tail1);
  for (int d = 0; d < p.ctx.shape.world_size; ++d) {
    const BoundRows bound = bound_of(d);
    int32_t r0, r1;
    block_padding_rows(T, t0, t1, bound.before, bound.through - bound.before, &r0, &r1);
    pad_rows(p, d, r0, r1);
    pad_rows(p, d, tail0, tail1);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
