// The one send path of both kernels (step 3): a block's own tokens as warp
// items, hidden rows (in segments when aligned, else whole), ids, weights and
// scales, written straight into each destination's receive rows.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/row_copy.cuh"
#include "dispatch/diagnostics.cuh"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Step 2, hidden rows that are 16-byte aligned: a segment of kSegmentBytes is
// loaded once into registers, then stored to every destination.
__device__ __forceinline__ int segment_vectors(const GroupShape& s, int segment) {
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  return static_cast<int>((s.hidden_row_bytes - offset < kSegmentBytes ? s.hidden_row_bytes - offset : kSegmentBytes) /
                          16);
}

__device__ __forceinline__ void load_segment(const DispatchParams& p, int32_t token, int segment, int lane,
                                             uint4 (&v)[kVectorsPerLane]) {
  const GroupShape& s = p.ctx.shape;
  const int vectors = segment_vectors(s, segment);
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.args.hidden) +
                                                    static_cast<int64_t>(token) * s.hidden_row_bytes +
                                                    static_cast<int64_t>(segment) * kSegmentBytes);
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) v[u] = __ldg(src + u * 32 + lane);
  }
}

__device__ __forceinline__ void store_segment(const DispatchParams& p, int segment, const TokenDestinations& dests,
                                              int lane, const uint4 (&v)[kVectorsPerLane]) {
  const GroupShape& s = p.ctx.shape;
  const int vectors = segment_vectors(s, segment);
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  for (uint64_t rest = dests.mask & ~rows_left_out(p); rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    uint4* dst =
        reinterpret_cast<uint4*>(p.ctx.rank_base(d) + p.ctx.offsets.recv_hidden + row * s.hidden_row_bytes + offset);
#pragma unroll
    for (int u = 0; u < kVectorsPerLane; ++u) {
      if (u * 32 + lane < vectors) dst[u * 32 + lane] = v[u];
    }
  }
}

// Step 2 for rows of any size and alignment: the whole row, per destination.
__device__ inline void send_hidden_row_any(const DispatchParams& p, int32_t token, const TokenDestinations& dests,
                                           int lane) {
  const GroupShape& s = p.ctx.shape;
  const char* src = static_cast<const char*>(p.args.hidden) + static_cast<int64_t>(token) * s.hidden_row_bytes;
  for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    warp_copy_bytes(p.ctx.rank_base(d) + p.ctx.offsets.recv_hidden + row * s.hidden_row_bytes, src, s.hidden_row_bytes,
                    lane);
  }
}

// Step 2, the small parts of a token: ids rewritten for each destination
// (picks it does not own become the invalid id), weights (0 without), scales
// (unless the send loop quantizes: its segments carry their own); in an
// expert layout also the token's index, which the receiver's expansion
// records as each expert row's source token.
__device__ inline void send_token_meta(const DispatchParams& p, int32_t token, const TokenDestinations& dests,
                                       int lane) {
  const GroupShape& s = p.ctx.shape;
  const int K = s.top_k;
  const int32_t* ids = p.args.topk_ids + static_cast<int64_t>(token) * K;
  const float* weights = p.args.topk_weights ? p.args.topk_weights + static_cast<int64_t>(token) * K : nullptr;
  for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    int32_t* ids_dst = p.ctx.remote<int32_t>(d, p.ctx.offsets.recv_ids) + row * K;
    float* weights_dst = p.ctx.remote<float>(d, p.ctx.offsets.recv_weights) + row * K;
    for (int k = lane; k < K; k += 32) {
      const int32_t id = __ldg(ids + k);
      const bool mine = is_valid_expert(s, id) && owner_of(s, id) == d;
      ids_dst[k] = mine ? id : s.invalid_expert_id;
      weights_dst[k] = weights ? __ldg(weights + k) : 0.0f;
    }
    if (s.send_token_index != 0 && lane == 0) p.ctx.remote<int32_t>(d, p.ctx.offsets.recv_tokens)[row] = token;
    if (s.scale_row_bytes > 0 && p.args.quantize == 0) {
      warp_copy_bytes(p.ctx.rank_base(d) + p.ctx.offsets.recv_scales + row * s.scale_row_bytes,
                      static_cast<const char*>(p.args.scales) + static_cast<int64_t>(token) * s.scale_row_bytes,
                      s.scale_row_bytes, lane);
    }
  }
}

// How a block's own tokens split into warp items: per token, the hidden row
// in segments (aligned rows) or whole (any other), then one item for ids,
// weights and scales.
struct OwnItems {
  int t0;
  bool aligned;
  int segments;
  int parts;
  int count;
  __device__ OwnItems(const DispatchParams& p, int t0, int t1) {
    const GroupShape& s = p.ctx.shape;
    this->t0 = t0;
    aligned = s.hidden_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.hidden) % 16 == 0;
    segments = aligned ? static_cast<int>((s.hidden_row_bytes + kSegmentBytes - 1) / kSegmentBytes) : 1;
    parts = segments + 1;
    count = (t1 - t0) * parts;
  }
  __device__ bool is_segment(int item) const { return aligned && item < count && item % parts < segments; }
};

// Step 2: the own tokens [t0, t1) as warp items (OwnItems), each sent to the
// ranks `destinations_of(token, lane)` names.  One code path for both
// kernels and both segment policies: the general kernel reads a token's slots
// back from token_slots, the small-batch kernel derives them from its shared
// ballots; `segments` moves the aligned hidden segments.
template <typename Segments, typename DestinationsOf>
__device__ __forceinline__ void send_own_tokens(const DispatchParams& p, int t0, int t1, Segments& segments,
                                                const DestinationsOf& destinations_of) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const OwnItems items(p, t0, t1);
  for (int item = warp; item < items.count; item += kWarpsPerBlock) {
    const int32_t token = t0 + item / items.parts;
    const int part = item % items.parts;
    const TokenDestinations dests = destinations_of(token, lane);
    if (part == items.segments) {
      send_token_meta(p, token, dests, lane);
    } else if (!items.aligned) {
      send_hidden_row_any(p, token, dests, lane);
    } else {
      segments.send(item, token, part, dests, lane);
    }
  }
  segments.finish();
}

// Shared memory given at launch: the segment policy's buffers.
extern __shared__ __align__(128) char segment_shared[];

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
