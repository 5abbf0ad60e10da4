// The reduction every combine schedule runs: a token's partials summed in
// fp32 from 0.0f in ascending rank order, which makes every schedule's result
// bitwise the same as the HOST backend's.
#pragma once

#include <stdint.h>

#include "combine/common.cuh"
#include "common/float_convert.cuh"
#include "common/kernel_common.cuh"

namespace moe_ep {
namespace kernels {

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

}  // namespace kernels
}  // namespace moe_ep
