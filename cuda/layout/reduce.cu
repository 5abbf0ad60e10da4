// The weighted reduction of expert rows back into rank-major rows
// (expert_layout_kernels.h): a warp per received row walks the row's expert
// rows in the order the expansion listed them (token_rows: ascending local
// expert, then pick), multiplies each by its weight (the product rounded to
// fp32, never fused into the add: the HOST backend and the oracle round the
// same way) and sums in fp32 from 0, then stores combine_dtype.
#include <stdint.h>

#include "common/float_convert.cuh"
#include "common/kernel_launch.cuh"
#include "expert_layout_kernels.h"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

constexpr int kWarps = kBlockThreads / 32;

struct ReduceParams {
  ExpertLayoutShape shape;
  RankMajorReceive in;
  ExpertRowsBuffers rows;
  const char* expert_output;
  char* out;
};

__device__ __forceinline__ float add_pick(float acc, float weight, float x, bool weighted) {
  return __fadd_rn(acc, weighted ? x : __fmul_rn(weight, x));
}

// The row's expert rows and weights, at most 32 at a time in the warp's lists.
struct RowPicks {
  const int32_t* list;  // token_rows of the row
  int top_k;
  __device__ int32_t row(int j) const { return j < top_k ? __ldg(list + j) : -1; }
};

// 16-byte vectors of kPer values: every lane takes vectors lane, lane + 32, ...
template <typename Element>
__device__ void reduce_row_vectors(const ReduceParams& p, const RowPicks& picks, char* dst, int lane) {
  constexpr int kPer = 16 / sizeof(typename Element::Bits);
  const ExpertLayoutShape& s = p.shape;
  const int64_t vectors = s.combine_row_bytes / 16;
  for (int64_t v = lane; v < vectors; v += 32) {
    float acc[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[e] = 0.0f;
    for (int j = 0;; ++j) {
      const int32_t r = picks.row(j);
      if (r < 0) break;
      const float w = __ldg(p.rows.weights + r);
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p.expert_output + r * s.combine_row_bytes) + v);
      const typename Element::Bits* b = reinterpret_cast<const typename Element::Bits*>(&x);
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[e] = add_pick(acc[e], w, Element::load(b[e]), s.weighted != 0);
    }
    reinterpret_cast<uint4*>(dst)[v] = Element::store_vector(acc);
  }
}

template <typename Element>
__device__ void reduce_row_scalars(const ReduceParams& p, const RowPicks& picks, char* dst, int lane) {
  using Bits = typename Element::Bits;
  const ExpertLayoutShape& s = p.shape;
  for (int h = lane; h < s.hidden_size; h += 32) {
    float acc = 0.0f;
    for (int j = 0;; ++j) {
      const int32_t r = picks.row(j);
      if (r < 0) break;
      const float w = __ldg(p.rows.weights + r);
      Bits x;
      memcpy(&x, p.expert_output + r * s.combine_row_bytes + static_cast<int64_t>(h) * sizeof(Bits), sizeof(Bits));
      acc = add_pick(acc, w, Element::load(x), s.weighted != 0);
    }
    const Bits y = Element::store(acc);
    memcpy(dst + static_cast<int64_t>(h) * sizeof(Bits), &y, sizeof(Bits));
  }
}

template <typename Element>
__device__ void reduce_row(const ReduceParams& p, const RowPicks& picks, char* dst, int lane) {
  const bool aligned = p.shape.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.expert_output) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  if (aligned) {
    reduce_row_vectors<Element>(p, picks, dst, lane);
  } else {
    reduce_row_scalars<Element>(p, picks, dst, lane);
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) expert_reduce_kernel(const ReduceParams p) {
  __shared__ int32_t recv_counts[kMaxWorldSize];
  wait_for_prior_grid();
  allow_dependent_launch();
  const ExpertLayoutShape& s = p.shape;
  for (int r = threadIdx.x; r < s.world_size; r += blockDim.x) recv_counts[r] = __ldg(p.in.recv_counts + r);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tpr = p.in.tokens_per_rank, end = s.world_size * tpr;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + warp; i < end;
       i += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int source = static_cast<int>(i / tpr);
    if (i - source * tpr >= recv_counts[source]) continue;
    const RowPicks picks{p.rows.token_rows + i * s.top_k, s.top_k};
    char* dst = p.out + i * s.combine_row_bytes;
    if (s.combine_dtype == kCombineBf16) {
      reduce_row<Bf16Element>(p, picks, dst, lane);
    } else if (s.combine_dtype == kCombineFp16) {
      reduce_row<Fp16Element>(p, picks, dst, lane);
    } else {
      reduce_row<Fp32Element>(p, picks, dst, lane);
    }
  }
}

}  // namespace

cudaError_t launch_reduce_expert_rows(const ExpertLayoutShape& shape, const RankMajorReceive& in,
                                      const ExpertRowsBuffers& rows, const void* expert_output, void* rank_major_out,
                                      int32_t max_blocks, int32_t pdl, cudaStream_t stream) {
  if (shape.world_size < 1 || shape.world_size > kMaxWorldSize || in.tokens_per_rank < 0 ||
      in.tokens_per_rank > shape.max_tokens_per_rank || shape.top_k < 1) {
    return cudaErrorInvalidValue;
  }
  const ReduceParams p{shape, in, rows, static_cast<const char*>(expert_output), static_cast<char*>(rank_major_out)};
  const int64_t receive = static_cast<int64_t>(shape.world_size) * in.tokens_per_rank;
  int64_t blocks = (receive + kWarps - 1) / kWarps;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  return launch_kernel(expert_reduce_kernel, static_cast<int>(blocks), kBlockThreads, 0, stream, pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
