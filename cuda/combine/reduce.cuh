// The reduction every combine schedule runs: a token's partials summed in
// fp32 from 0.0f in ascending rank order, which makes every schedule's result
// bitwise the same as the HOST backend's.
#pragma once

#include <stdint.h>

#include "combine/common.cuh"
#include "common/float_convert.cuh"
#include "common/kernel_common.cuh"
#include "wire/wire_sums.cuh"

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

// ---- The FP8 combine wire (GroupShape::combine_wire) ----
// The partials are wire rows (wire_transfer_row_bytes): each is dequantized
// as it is added, in the same ascending rank order from 0.0 in fp32, with
// the sums of wire/wire_sums.cuh, so the bits are the HOST backend's.

// One 2 KiB segment of an output row (its elements' codes: a 1 KiB segment of
// each partial for 16-bit outputs, 512 B for fp32), aligned rows: two ranks'
// codes and scales loaded before either is added.
template <typename Element>
__device__ void reduce_wire_segment(const CombineParams& p, int32_t token, int segment, const TokenDestinations& srcs,
                                    int lane) {
  constexpr int kSegmentElems = kReduceSegmentBytes / static_cast<int>(sizeof(typename Element::Bits));
  constexpr int kChunks = kSegmentElems / (32 * wire::kLaneElems);
  const int32_t H = p.ctx.shape.hidden_size;
  const int64_t scales_at = wire_transfer_scales_offset(H);
  const int32_t start = segment * kSegmentElems + lane * wire::kLaneElems;
  float acc[kChunks][wire::kLaneElems];
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
#pragma unroll
    for (int k = 0; k < wire::kLaneElems; ++k) acc[i][k] = 0.0f;
  }
  uint64_t rest = srcs.mask;  // ascending rank order
  while (rest != 0) {
    const int q0 = lowest_rank(rest);
    rest &= rest - 1;
    const int q1 = rest != 0 ? lowest_rank(rest) : -1;
    if (q1 >= 0) rest &= rest - 1;
    const char* rows[2] = {partial_row(p, q0, srcs.slot(q0)),
                           q1 >= 0 ? partial_row(p, q1, srcs.slot(q1 >= 0 ? q1 : q0)) : nullptr};
    uint2 codes[2][kChunks];
    float scale[2][kChunks];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int32_t first = start + i * 32 * wire::kLaneElems;
        if (rows[r] != nullptr && first < H) {
          codes[r][i] = __ldcg(reinterpret_cast<const uint2*>(rows[r] + first));
          scale[r][i] = __ldcg(reinterpret_cast<const float*>(rows[r] + scales_at) + first / kWireBlockElems);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (rows[r] == nullptr) continue;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        if (start + i * 32 * wire::kLaneElems < H) wire::add_wire_lane(acc[i], codes[r][i], scale[r][i]);
      }
    }
  }
  char* out = static_cast<char*>(p.args.output) + token * p.ctx.shape.combine_row_bytes;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int32_t first = start + i * 32 * wire::kLaneElems;
    if (first < H) wire::store_lane_sums<Element>(out, first, H, /*vector=*/true, acc[i]);
  }
}

// Rows of any size or alignment: a lane's 8 elements at a time, element by
// element.
template <typename Element>
__device__ void reduce_wire_row_any(const CombineParams& p, int32_t token, const TokenDestinations& srcs, int lane) {
  const int32_t H = p.ctx.shape.hidden_size;
  const int64_t scales_at = wire_transfer_scales_offset(H);
  char* out = static_cast<char*>(p.args.output) + token * p.ctx.shape.combine_row_bytes;
  // Warp-uniform trip count: slot() shuffles need every lane.
  for (int32_t base = 0; base < H; base += 32 * wire::kLaneElems) {
    const int32_t first = base + lane * wire::kLaneElems;
    float acc[wire::kLaneElems];
#pragma unroll
    for (int k = 0; k < wire::kLaneElems; ++k) acc[k] = 0.0f;
    for (uint64_t rest = srcs.mask; rest != 0; rest &= rest - 1) {
      const int q = lowest_rank(rest);
      const char* row = partial_row(p, q, srcs.slot(q));
      if (first < H) {
        const float scale = __ldcg(reinterpret_cast<const float*>(row + scales_at) + first / kWireBlockElems);
        wire::add_wire_lane(acc, wire::load_wire_lane(row, first, H, /*vector=*/false), scale);
      }
    }
    if (first < H) wire::store_lane_sums<Element>(out, first, H, /*vector=*/false, acc);
  }
}

// The Element of a combine dtype whose partials cross as FP8 wire rows: a
// type of its own, so that the kernels instantiated for it hold the wire's
// reduction and the AS_IS kernels compile as if the wire did not exist.
template <typename Element>
struct WireRows {};

template <typename Element>
struct PartialRows {  // Element: AS_IS partials
  static constexpr bool kWire = false;
  using Output = Element;
};
template <typename Element>
struct PartialRows<WireRows<Element>> {
  static constexpr bool kWire = true;
  using Output = Element;
};

// Element, or WireRows<Element> when kWire.
template <typename Element, bool kWire>
struct SelectPartials {
  using type = Element;
};
template <typename Element>
struct SelectPartials<Element, true> {
  using type = WireRows<Element>;
};

// A token's output segment (aligned) or whole row, from partials of the
// combine dtype (Element) or FP8 wire rows (WireRows<Element>).
template <typename Element>
__device__ __forceinline__ void reduce_token(const CombineParams& p, int32_t token, int segment,
                                             const TokenDestinations& srcs, bool aligned, int lane) {
  using Output = typename PartialRows<Element>::Output;
  if constexpr (PartialRows<Element>::kWire) {
    if (aligned) {
      reduce_wire_segment<Output>(p, token, segment, srcs, lane);
    } else {
      reduce_wire_row_any<Output>(p, token, srcs, lane);
    }
  } else if (aligned) {
    reduce_segment<Element>(p, token, segment, srcs, lane);
  } else {
    reduce_row_any<Element>(p, token, srcs, lane);
  }
}

}  // namespace kernels
}  // namespace moe_ep
