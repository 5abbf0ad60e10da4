// What the combine kernels share: their parameters, where a token's partial
// from each rank lives, and the fp32 accumulation in ascending rank order
// that makes every schedule's result bitwise the same as the HOST backend's.
#pragma once

#include <stdint.h>

#include "float_convert.cuh"
#include "kernel_common.cuh"
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

__device__ __forceinline__ bool combine_rows_aligned(const CombineParams& p) {
  return p.ctx.shape.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.expert_output) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.args.output) % 16 == 0;
}

__device__ __forceinline__ int reduce_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_row_bytes + kReduceSegmentBytes - 1) / kReduceSegmentBytes)
                 : 1;
}

// Where the partial of local token `token` from rank q lives (q's slot known):
// this rank's own in its expert_output; a peer's in this rank's combine_in
// (pushed there), or, on the pull path, in the peer's combine_input view (a
// zero-copy workspace has no combine_in).
__device__ __forceinline__ const char* partial_row(const CombineParams& p, int q, int32_t slot) {
  const KernelContext& c = p.ctx;
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row_bytes = c.shape.combine_row_bytes;
  if (q == c.shape.rank) {
    return static_cast<const char*>(p.args.expert_output) + (c.shape.rank * tpr + slot) * row_bytes;
  }
  if (p.args.pull) {
    return c.rank_base(q) + c.offsets.combine_input + (c.shape.rank * tpr + slot) * row_bytes;
  }
  return c.state.local_base + c.offsets.combine_in + (c.combine_segment(q, c.shape.rank) * tpr + slot) * row_bytes;
}

// Adds one 2 KiB segment of a partial (16-byte vectors) into the accumulators.
template <typename Element>
__device__ __forceinline__ void accumulate(float (&acc)[kReduceVectorsPerLane][16 / sizeof(typename Element::Bits)],
                                           const uint4 (&v)[kReduceVectorsPerLane]) {
#pragma unroll
  for (int u = 0; u < kReduceVectorsPerLane; ++u) Element::add_vector(acc[u], v[u]);
}

// Rows of any size or alignment: element by element.
template <typename Element>
__device__ void reduce_row_any(const CombineParams& p, int32_t token, const TokenDestinations& srcs, int lane) {
  using Bits = typename Element::Bits;
  const int H = p.ctx.shape.hidden_size;
  Bits* dst = reinterpret_cast<Bits*>(static_cast<char*>(p.args.output) + token * p.ctx.shape.combine_row_bytes);
  for (int h0 = 0; h0 < H; h0 += 32) {  // warp-uniform trip count: slot() shuffles need every lane
    const int h = h0 + lane;
    float acc = 0.0f;
    for (uint64_t rest = srcs.mask; rest != 0; rest &= rest - 1) {
      const int q = lowest_rank(rest);
      const Bits* src = reinterpret_cast<const Bits*>(partial_row(p, q, srcs.slot(q)));
      if (h < H) acc += Element::load(__ldcg(src + h));
    }
    if (h < H) dst[h] = Element::store(acc);
  }
}

// Stores one 2 KiB segment of an output row from its fp32 accumulators.
template <typename Element>
__device__ __forceinline__ void store_segment(
    const CombineParams& p, int32_t token, int64_t offset, int vectors,
    const float (&acc)[kReduceVectorsPerLane][16 / sizeof(typename Element::Bits)], int lane) {
  uint4* dst =
      reinterpret_cast<uint4*>(static_cast<char*>(p.args.output) + token * p.ctx.shape.combine_row_bytes + offset);
#pragma unroll
  for (int u = 0; u < kReduceVectorsPerLane; ++u) {
    if (u * 32 + lane >= vectors) continue;
    dst[u * 32 + lane] = Element::store_vector(acc[u]);
  }
}

// One lane's fp32 sums for one 2 KiB segment of an output row, from 0.0f.
template <typename Element>
struct SegmentSums {
  float v[kReduceVectorsPerLane][16 / sizeof(typename Element::Bits)];
  __device__ __forceinline__ SegmentSums() {
#pragma unroll
    for (int u = 0; u < kReduceVectorsPerLane; ++u) {
#pragma unroll
      for (int e = 0; e < static_cast<int>(16 / sizeof(typename Element::Bits)); ++e) v[u][e] = 0.0f;
    }
  }
};

// Vectors of 16 bytes in 2 KiB segment `segment` of a combine row.
__device__ __forceinline__ int reduce_segment_vectors(const CombineParams& p, int segment) {
  const int64_t row_bytes = p.ctx.shape.combine_row_bytes;
  const int64_t offset = static_cast<int64_t>(segment) * kReduceSegmentBytes;
  return static_cast<int>((row_bytes - offset < kReduceSegmentBytes ? row_bytes - offset : kReduceSegmentBytes) / 16);
}

// One 2 KiB segment of an output row, 16-byte vectors.  The partials are
// loaded two ranks at a time before either is added (more bytes in flight per
// warp), and added strictly in ascending rank order.
template <typename Element>
__device__ void reduce_segment(const CombineParams& p, int32_t token, int segment, const TokenDestinations& srcs,
                               int lane) {
  const int64_t offset = static_cast<int64_t>(segment) * kReduceSegmentBytes;
  const int vectors = reduce_segment_vectors(p, segment);
  SegmentSums<Element> sums;
  auto& acc = sums.v;
  uint64_t rest = srcs.mask;  // ascending rank order
  while (rest != 0) {
    const int q0 = lowest_rank(rest);
    rest &= rest - 1;
    const int q1 = rest != 0 ? lowest_rank(rest) : -1;
    if (q1 >= 0) rest &= rest - 1;
    const uint4* a = reinterpret_cast<const uint4*>(partial_row(p, q0, srcs.slot(q0)) + offset);
    const int32_t slot1 = srcs.slot(q1 >= 0 ? q1 : q0);
    const uint4* b = q1 >= 0 ? reinterpret_cast<const uint4*>(partial_row(p, q1, slot1) + offset) : nullptr;
    uint4 va[kReduceVectorsPerLane] = {}, vb[kReduceVectorsPerLane] = {};
#pragma unroll
    for (int u = 0; u < kReduceVectorsPerLane; ++u) {
      if (u * 32 + lane < vectors) {
        va[u] = __ldcg(a + u * 32 + lane);
        if (b) vb[u] = __ldcg(b + u * 32 + lane);
      }
    }
    accumulate<Element>(acc, va);
    if (b) accumulate<Element>(acc, vb);
  }
  store_segment<Element>(p, token, offset, vectors, acc, lane);
}

// The pull schedule (CombineLaunch::pull): its own kernel, combine_pull.cu.
cudaError_t launch_combine_pull(const CombineParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
