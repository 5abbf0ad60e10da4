// The quantizing segment policy of the send path: the FP8 dispatch wire
// (docs/nvlink_backend.md, "The FP8 wires") encoded where the rows are sent,
// so that the caller's rows are read once and only codes and scales are
// written, to every destination.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/row_send.cuh"
#include "wire/wire_rows.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// A segment item is kSegmentBytes of codes: 4096 elements, 32 blocks of 128.
// Lane l holds, for each u < kVectorsPerLane, the 16 elements of code vector
// u * 32 + l, so a block is 8 lanes of one u (its amax three shuffles) and
// the codes are the 16-byte vectors a register segment stores; lane l then
// holds block l's scale, and a segment's scales cross as one 128-byte store
// per destination.  The bits are the quantize kernel's (cuda/wire/quantize.cu):
// the same finite amax, block_scale and encode_lane.
constexpr int kQuantizeVectorElems = 16;
constexpr int kQuantizeBlockLanes = kWireBlockElems / kQuantizeVectorElems;
constexpr int kQuantizeBlocksPerVector = 32 / kQuantizeBlockLanes;
static_assert(kSegmentBytes / kWireBlockElems == 32, "a segment's scales are one per lane");
static_assert(kVectorsPerLane * kQuantizeBlocksPerVector == 32, "a segment's blocks are one per lane");

// Where a lane's quantized vectors go: every destination's receive row
// (send), or the warp's shared buffer (start).
struct SegmentTarget {
  const DispatchParams& p;
  const TokenDestinations* dests;  // null: `shared`
  char* shared;
  int segment;

  // Code vectors (first + u) * 32 + lane of the segment, u < kCount, those
  // before `vectors` (the segment's).  Every lane of the warp calls it: a
  // destination's row is warp-collective (TokenDestinations::slot), only
  // the stores are predicated, and each destination's row is found once
  // for the kCount vectors.
  template <int kCount>
  __device__ __forceinline__ void codes(int first, const uint4 (&c)[kCount], int vectors, int lane) const {
    if (dests == nullptr) {
#pragma unroll
      for (int u = 0; u < kCount; ++u) {
        const int vector = (first + u) * 32 + lane;
        if (vector < vectors) reinterpret_cast<uint4*>(shared)[vector] = c[u];
      }
      return;
    }
    for (uint64_t rest = dests->mask & ~rows_left_out(p); rest != 0; rest &= rest - 1) {
      uint4* row = reinterpret_cast<uint4*>(
          receive_row(lowest_rank(rest), p.ctx.offsets.recv_hidden, p.ctx.shape.hidden_row_bytes) +
          static_cast<int64_t>(segment) * kSegmentBytes);
#pragma unroll
      for (int u = 0; u < kCount; ++u) {
        const int vector = (first + u) * 32 + lane;
        if (vector < vectors) row[vector] = c[u];
      }
    }
  }
  // The scale of the segment's block `block` (one lane each), where `in_row`;
  // every lane calls it, as codes().
  __device__ __forceinline__ void scale(int block, float v, bool in_row) const {
    if (dests == nullptr) {
      if (in_row) reinterpret_cast<float*>(shared + kSegmentBytes)[block] = v;
      return;
    }
    for (uint64_t rest = dests->mask & ~rows_left_out(p); rest != 0; rest &= rest - 1) {
      char* row = receive_row(lowest_rank(rest), p.ctx.offsets.recv_scales, p.ctx.shape.scale_row_bytes);
      if (in_row) reinterpret_cast<float*>(row)[segment * 32 + block] = v;
    }
  }
  // The token's row at destination d in the receive region at `region`,
  // rows `row_bytes` apart (warp-collective).
  __device__ __forceinline__ char* receive_row(int d, uint64_t region, int64_t row_bytes) const {
    const int64_t row = static_cast<int64_t>(p.ctx.shape.rank) * p.args.tokens_per_rank + dests->slot(d);
    return p.ctx.rank_base(d) + region + row * row_bytes;
  }
};

// Vector u's 16 elements (E::kVectors raw words per 8) into codes; returns
// its block's scale in the lanes of the block.  Every lane of the warp calls
// it.
template <class E>
__device__ __forceinline__ uint4 quantize_vector(const uint4 (&x)[2 * E::kVectors], int32_t rule, float& scale) {
  float lo[wire::kLaneElems], hi[wire::kLaneElems];
  E::convert(x, lo);
  E::convert(x + E::kVectors, hi);
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < wire::kLaneElems; ++k) amax = wire::finite_max(wire::finite_max(amax, lo[k]), hi[k]);
#pragma unroll
  for (int d = kQuantizeBlockLanes / 2; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
  scale = wire::block_scale(amax, rule);
  uint32_t a[wire::kLaneElems / 2], b[wire::kLaneElems / 2];
  wire::encode_lane(lo, scale, rule, a);
  wire::encode_lane(hi, scale, rule, b);
  return make_uint4(a[0] | a[1] << 16, a[2] | a[3] << 16, b[0] | b[1] << 16, b[2] | b[3] << 16);
}

// A segment of token `token`'s row into `target`: its loads issued in groups
// of 32 registers (4 vectors of bf16 or fp16, 2 of fp32, as many bytes in
// flight as a register segment), each group encoded and stored before the
// next is loaded, so that a group's codes are all the send loop holds (its
// vectors encoded side by side, then stored together, each destination's row
// found once per group).  Lane
// j gathers block j's scale and stores it last.  A vector past the row is
// skipped by the whole warp (the shuffles stay convergent).
template <class E>
__device__ __forceinline__ void quantize_segment_as(const DispatchParams& p, int32_t token, int segment, int lane,
                                                    const SegmentTarget& target) {
  constexpr int kRaw = 2 * E::kVectors;
  constexpr int kGroup = kVectorsPerLane / E::kBytes;
  const int vectors = segment_vectors(p.ctx.shape, segment);
  const char* src = static_cast<const char*>(p.args.hidden) + static_cast<int64_t>(token) * p.args.quantize_row_bytes +
                    (static_cast<int64_t>(segment) * kSegmentBytes + lane * kQuantizeVectorElems) * E::kBytes;
  float lane_scale = 1.0f;
#pragma unroll
  for (int g = 0; g < kVectorsPerLane; g += kGroup) {
    if (g * 32 >= vectors) break;
    uint4 x[kGroup][kRaw];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      const bool in_row = (g + u) * 32 + lane < vectors;
      const char* v = src + static_cast<int64_t>(g + u) * 32 * kQuantizeVectorElems * E::kBytes;
#pragma unroll
      for (int i = 0; i < kRaw; ++i) x[u][i] = in_row ? wire::load_nc(v + 16 * i) : make_uint4(0u, 0u, 0u, 0u);
    }
    // The group's vectors are encoded side by side (independent chains), then
    // stored together.
    uint4 c[kGroup];
    float scale[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      c[u] = make_uint4(0u, 0u, 0u, 0u);
      scale[u] = 1.0f;
      if ((g + u) * 32 < vectors) c[u] = quantize_vector<E>(x[u], p.args.quantize_rule, scale[u]);
    }
    target.codes(g, c, vectors, lane);
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      if ((g + u) * 32 >= vectors) break;
      // Lane l' holds block (g + u) * 4 + l' / 8; lane j takes block j.
      const float gathered =
          __shfl_sync(0xFFFFFFFFu, scale[u], (lane % kQuantizeBlocksPerVector) * kQuantizeBlockLanes);
      if (lane / kQuantizeBlocksPerVector == g + u) lane_scale = gathered;
    }
  }
  const int blocks = (vectors + kQuantizeBlockLanes - 1) / kQuantizeBlockLanes;
  target.scale(lane, lane_scale, lane < blocks);
}

__device__ __forceinline__ void quantize_segment(const DispatchParams& p, int32_t token, int segment, int lane,
                                                 const SegmentTarget& target) {
  switch (p.args.quantize_dtype) {
    case kCombineFp16: quantize_segment_as<wire::Elements<kCombineFp16>>(p, token, segment, lane, target); break;
    case kCombineFp32: quantize_segment_as<wire::Elements<kCombineFp32>>(p, token, segment, lane, target); break;
    default: quantize_segment_as<wire::Elements<kCombineBf16>>(p, token, segment, lane, target); break;
  }
}

// A segment start() quantized into `shared`, to every destination.
__device__ __forceinline__ void store_shared_segment(const DispatchParams& p, int segment, const char* shared,
                                                     const SegmentTarget& target, int lane) {
  const int vectors = segment_vectors(p.ctx.shape, segment);
  uint4 c[kVectorsPerLane];
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    const int vector = u * 32 + lane;
    c[u] = vector < vectors ? reinterpret_cast<const uint4*>(shared)[vector] : make_uint4(0u, 0u, 0u, 0u);
  }
  target.codes(0, c, vectors, lane);
  const int blocks = (vectors + kQuantizeBlockLanes - 1) / kQuantizeBlockLanes;
  const bool has_block = lane < blocks;
  target.scale(lane, has_block ? reinterpret_cast<const float*>(shared + kSegmentBytes)[lane] : 0.0f, has_block);
}

// Dynamic shared memory of a block: each warp's first segment, codes then
// scales, quantized before routing.
constexpr size_t kQuantizeWarpSharedBytes = kSegmentBytes + 32 * sizeof(float);
constexpr size_t kQuantizeSegmentsSharedBytes = size_t{kWarpsPerBlock} * kQuantizeWarpSharedBytes;

// QuantizeSegments (DispatchLaunch::quantize): as RegisterSegments, each
// segment quantized in registers and stored to every destination with its
// scales.  The first segment of each warp is quantized before routing, into
// shared memory: held in registers across the routing it would spill the
// send loop's.  The token's other item (send_token_meta) sends no scales.
class QuantizeSegments {
 public:
  __device__ QuantizeSegments(const DispatchParams& p, int t0, int t1, char* shared)
      : p_(p), items_(p, t0, t1), first_(shared + (threadIdx.x / 32) * kQuantizeWarpSharedBytes) {}
  static constexpr size_t kSharedBytes = kQuantizeSegmentsSharedBytes;

  // Each lane reads back only the vectors and the scale it wrote: no other
  // lane's, so no warp barrier.
  __device__ void start() {
    const int item = threadIdx.x / 32;
    prefetched_ = items_.is_segment(item);
    if (!prefetched_) return;
    const int segment = item % items_.parts;
    quantize_segment(p_, items_.t0 + item / items_.parts, segment, threadIdx.x % 32,
                     SegmentTarget{p_, nullptr, first_, segment});
  }
  __device__ void abandon() {}
  __device__ void send(int item, int32_t token, int segment, const TokenDestinations& dests, int lane) {
    const SegmentTarget target{p_, &dests, nullptr, segment};
    if (item == threadIdx.x / 32 && prefetched_) {
      store_shared_segment(p_, segment, first_, target, lane);
    } else {
      quantize_segment(p_, token, segment, lane, target);
    }
  }
  __device__ void finish() {}

 private:
  const DispatchParams& p_;
  const OwnItems items_;
  char* const first_;
  bool prefetched_ = false;
};

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
