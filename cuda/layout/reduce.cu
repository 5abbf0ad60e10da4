// The weighted reduction of expert rows back into rank-major rows
// (expert_layout_kernels.h).  The work is cut into (received row, segment)
// items so that a few rows still spread over every SM: a warp per item of
// kExpertSegmentBytes of the row.  The warp reads the row's expert rows in
// the order the expansion listed them (token_rows: ascending local expert,
// then pick) into its lanes once, then each lane sums its vectors over the
// picks with kPickBatch picks' loads in flight: one pick at a time leaves
// the reduction bound by the latency of dependent loads, not by HBM.  Each
// product is rounded to fp32, never fused into the add (the HOST backend
// and the oracle round the same way), the sum starts from 0 and the result
// is stored as combine_dtype.
#include <stdint.h>

#include "common/float_convert.cuh"
#include "common/kernel_launch.cuh"
#include "expert_layout_kernels.h"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

constexpr int kWarps = kBlockThreads / 32;
constexpr uint32_t kFullMask = 0xFFFFFFFFu;
// Picks whose loads a lane has in flight, and 16-byte vectors per lane of a
// segment (kExpertSegmentBytes = 32 lanes x kLaneVectors x 16 bytes).
constexpr int kPickBatch = 8;
constexpr int kLaneVectors = 2;
static_assert(kExpertSegmentBytes == 32 * kLaneVectors * 16, "a segment is one vector pass of the warp");

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

// A row's expert rows and their weights: the first 32 held by the lanes
// (lane j: pick j), the rest read when needed.
struct RowPicks {
  const int32_t* list;  // token_rows of the row
  const float* weights;
  int count;            // expert rows listed (the list ends at -1 or at top_k)
  int32_t lane_row;     // the row of pick `lane`, when lane < count
  float lane_weight;

  // Pick j's row and weight; j is the same in every lane.
  __device__ __forceinline__ void get(int j, int32_t* row, float* weight) const {
    if (j < 32) {
      *row = __shfl_sync(kFullMask, lane_row, j);
      *weight = __shfl_sync(kFullMask, lane_weight, j);
    } else {
      *row = __ldg(list + j);
      *weight = __ldg(weights + *row);
    }
  }
};

__device__ RowPicks load_picks(const ExpertRowsBuffers& rows, const int32_t* list, int top_k, int lane) {
  RowPicks picks{list, rows.weights, top_k, -1, 0.0f};
  for (int c = 0; c < top_k; c += 32) {
    const int j = c + lane;
    const int32_t r = j < top_k ? __ldg(list + j) : -1;
    if (c == 0) {
      picks.lane_row = r;
      picks.lane_weight = r >= 0 ? __ldg(rows.weights + r) : 0.0f;
    }
    const uint32_t ends = __ballot_sync(kFullMask, r < 0);
    if (ends != 0) {
      picks.count = c + __ffs(ends) - 1;
      break;
    }
  }
  return picks;
}

// The segment's 16-byte vectors of kPer values, lane + 32 u for u < kLaneVectors.
template <typename Element>
__device__ void reduce_segment_vectors(const ReduceParams& p, const RowPicks& picks, int64_t first_vector, char* dst,
                                       int lane) {
  using Bits = typename Element::Bits;
  constexpr int kPer = 16 / sizeof(Bits);
  const ExpertLayoutShape& s = p.shape;
  const int64_t vectors = s.combine_row_bytes / 16;
  float acc[kLaneVectors][kPer];
#pragma unroll
  for (int u = 0; u < kLaneVectors; ++u) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) acc[u][e] = 0.0f;
  }
  for (int j0 = 0; j0 < picks.count; j0 += kPickBatch) {
    uint4 x[kPickBatch][kLaneVectors];
    float w[kPickBatch];
#pragma unroll
    for (int q = 0; q < kPickBatch; ++q) {
      int32_t r = 0;
      w[q] = 0.0f;
      if (j0 + q < picks.count) picks.get(j0 + q, &r, &w[q]);
      const uint4* from = reinterpret_cast<const uint4*>(p.expert_output + r * s.combine_row_bytes);
#pragma unroll
      for (int u = 0; u < kLaneVectors; ++u) {
        const int64_t v = first_vector + lane + 32 * u;
        x[q][u] = j0 + q < picks.count && v < vectors ? __ldg(from + v) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int q = 0; q < kPickBatch; ++q) {
      if (j0 + q >= picks.count) break;
#pragma unroll
      for (int u = 0; u < kLaneVectors; ++u) {
        const Bits* b = reinterpret_cast<const Bits*>(&x[q][u]);
#pragma unroll
        for (int e = 0; e < kPer; ++e) acc[u][e] = add_pick(acc[u][e], w[q], Element::load(b[e]), s.weighted != 0);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kLaneVectors; ++u) {
    const int64_t v = first_vector + lane + 32 * u;
    if (v < vectors) reinterpret_cast<uint4*>(dst)[v] = Element::store_vector(acc[u]);
  }
}

// Unaligned rows: the segment's elements one at a time.
template <typename Element>
__device__ void reduce_segment_scalars(const ReduceParams& p, const RowPicks& picks, int64_t first_byte, char* dst,
                                       int lane) {
  using Bits = typename Element::Bits;
  const ExpertLayoutShape& s = p.shape;
  const int64_t first = first_byte / static_cast<int64_t>(sizeof(Bits));
  int64_t end = first + kExpertSegmentBytes / static_cast<int64_t>(sizeof(Bits));
  if (end > s.hidden_size) end = s.hidden_size;
  // The loop is the same in every lane: picks.get shuffles across the warp.
  for (int64_t h0 = first; h0 < end; h0 += 32) {
    const int64_t h = h0 + lane;
    float acc = 0.0f;
    for (int j = 0; j < picks.count; ++j) {
      int32_t r;
      float w;
      picks.get(j, &r, &w);
      if (h < end) {
        Bits x;
        memcpy(&x, p.expert_output + r * s.combine_row_bytes + h * static_cast<int64_t>(sizeof(Bits)), sizeof(Bits));
        acc = add_pick(acc, w, Element::load(x), s.weighted != 0);
      }
    }
    if (h < end) {
      const Bits y = Element::store(acc);
      memcpy(dst + h * static_cast<int64_t>(sizeof(Bits)), &y, sizeof(Bits));
    }
  }
}

template <typename Element>
__device__ void reduce_segment(const ReduceParams& p, const RowPicks& picks, int64_t first_byte, char* dst, int lane) {
  const bool aligned = p.shape.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.expert_output) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.out) % 16 == 0;
  if (aligned) {
    reduce_segment_vectors<Element>(p, picks, first_byte / 16, dst, lane);
  } else {
    reduce_segment_scalars<Element>(p, picks, first_byte, dst, lane);
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
  const int64_t tpr = p.in.tokens_per_rank, segments = expert_layout_segments(s.combine_row_bytes);
  const int64_t end = s.world_size * tpr * segments;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp; item < end;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = item / segments, first_byte = (item - i * segments) * kExpertSegmentBytes;
    const int source = static_cast<int>(i / tpr);
    if (i - source * tpr >= recv_counts[source]) continue;  // warp-uniform
    const RowPicks picks = load_picks(p.rows, p.rows.token_rows + i * s.top_k, s.top_k, lane);
    char* dst = p.out + i * s.combine_row_bytes;
    if (s.combine_dtype == kCombineBf16) {
      reduce_segment<Bf16Element>(p, picks, first_byte, dst, lane);
    } else if (s.combine_dtype == kCombineFp16) {
      reduce_segment<Fp16Element>(p, picks, first_byte, dst, lane);
    } else {
      reduce_segment<Fp32Element>(p, picks, first_byte, dst, lane);
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
  const int64_t items =
      static_cast<int64_t>(shape.world_size) * in.tokens_per_rank * expert_layout_segments(shape.combine_row_bytes);
  int64_t blocks = (items + kWarps - 1) / kWarps;
  if (blocks > max_blocks) blocks = max_blocks;
  if (blocks < 1) blocks = 1;
  return launch_kernel(expert_reduce_kernel, static_cast<int>(blocks), kBlockThreads, 0, stream, pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
