// Routing of the small-batch kernel: every token in one round of one token
// per thread, the slots derived from the shared ballots.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/params.cuh"
#include "dispatch/routing.cuh"

namespace moe_ep {
namespace kernels {
namespace {

static_assert(kSmallDispatchMaxTokens <= kBlockThreads, "the small-batch routing is one round");

struct SmallShared {
  RoutingShared r;                // r.warp_counts holds each warp's ballots (bit per token)
  uint64_t masks[kBlockThreads];  // destinations of every local token
  uint32_t wait_ok[kMaxWorldSize];
};

// Slot of local token `token` on rank d, -1 when it does not go there.
__device__ __forceinline__ int32_t small_slot(const SmallShared& sh, int token, int d) {
  const int w = token / 32;
  const uint32_t below = (1u << (token % 32)) - 1u;
  return ((sh.masks[token] >> d) & 1u) != 0
             ? static_cast<int32_t>(sh.r.warp_offsets[w][d] + __popc(sh.r.warp_counts[w][d] & below))
             : -1;
}

// How many of the local tokens [0, x) go to rank d (x <= kBlockThreads).
__device__ __forceinline__ int32_t small_bound_before(const SmallShared& sh, int x, int d) {
  const int w = x / 32;
  if (w >= kWarpsPerBlock) return static_cast<int32_t>(sh.r.totals[d]);
  return static_cast<int32_t>(sh.r.warp_offsets[w][d] + __popc(sh.r.warp_counts[w][d] & ((1u << (x % 32)) - 1u)));
}

__device__ __forceinline__ TokenDestinations small_destinations(const SmallShared& sh, int token, int world, int lane) {
  TokenDestinations d;
  d.slot_low = lane < world ? small_slot(sh, token, lane) : -1;
  d.slot_high = lane + 32 < world ? small_slot(sh, token, lane + 32) : -1;
  d.mask = sh.masks[token];
  return d;
}

// Step 1 in one round: thread t routes token t.  Ends with a barrier after
// which sh.r.totals, the slots and sh.r.timed_out are final.
__device__ void route_small(const DispatchParams& p, int t0, int t1, uint32_t timed_out, SmallShared& sh) {
  const GroupShape& s = p.ctx.shape;
  const int T = p.args.num_tokens, world = s.world_size;
  const int t = threadIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool counts_picks = blockIdx.x == 0;
  int32_t* hist = histogram_of(p, sh.r);
  // The token's first kHeldPicks ids are loaded once, in one round whose
  // latency the histogram's zeroing and its barrier hide, and give both the
  // mask and block 0's counts (rather than load rounds for the mask and
  // reloads for the counts after the barrier).
  constexpr int kHeldPicks = 8;
  const int32_t* ids = p.args.topk_ids + static_cast<int64_t>(t) * s.top_k;
  const int held = t < T ? min(s.top_k, kHeldPicks) : 0;
  int32_t id[kHeldPicks];
#pragma unroll
  for (int k = 0; k < kHeldPicks; ++k) id[k] = k < held ? __ldg(ids + k) : 0;
  const uint64_t routable = routable_ranks(p);
  if (counts_picks && hist == sh.r.histogram) {
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) sh.r.histogram[x] = 0;
  }
  __syncthreads();
  uint64_t mask = 0;
#pragma unroll
  for (int k = 0; k < kHeldPicks; ++k) {
    if (k >= held) break;
    add_owner(s, id[k], mask);
    if (counts_picks) count_pick(p, t, k, id[k], hist, routable);
  }
  for (int k = kHeldPicks; t < T && k < s.top_k; ++k) {  // top_k > kHeldPicks: the rest one by one
    const int32_t x = __ldg(ids + k);
    add_owner(s, x, mask);
    if (counts_picks) count_pick(p, t, k, x, hist, routable);
  }
  mask &= routable;
  sh.masks[t] = mask;
  for (int d = 0; d < world; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) sh.r.warp_counts[warp][d] = ballot;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    uint32_t running = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      sh.r.warp_offsets[w][d] = running;
      running += __popc(sh.r.warp_counts[w][d]);
    }
    sh.r.totals[d] = running;
  }
  if (threadIdx.x == 0) sh.r.timed_out = timed_out;
  __syncthreads();
  if (t >= t0 && t < t1) {  // kept for combine
    int32_t* row = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t) * world;
    for (int d = 0; d < world; ++d) row[d] = small_slot(sh, t, d);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
