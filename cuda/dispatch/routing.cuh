// Routing of the general kernel (step 1): which ranks each token goes to,
// its slot among the routed tokens on each, and the picks per expert.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/diagnostics.cuh"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Adds the rank that owns pick `id` to `mask`; nothing for a masked or bad
// id.  (A branch: as a select, the general kernel's register path spills
// more.)
__device__ __forceinline__ void add_owner(const GroupShape& s, int32_t id, uint64_t& mask) {
  if (is_valid_expert(s, id)) mask |= uint64_t{1} << owner_of(s, id);
}

// Ranks that own at least one valid pick of the token, among `routable`
// (routable_ranks).  (Unrolled by 4: unrolled by 8, one load round for
// top-8, the general kernel's register path spills more.)
__device__ inline uint64_t token_mask(const GroupShape& s, const int32_t* ids_row, uint64_t routable) {
  uint64_t mask = 0;
#pragma unroll 4
  for (int k = 0; k < s.top_k; ++k) add_owner(s, __ldg(ids_row + k), mask);
  return mask & routable;
}

// Counts pick k of a token, `id`, for its expert unless its owner is masked
// (not in `routable`), or reports it when it is bad (first = lowest
// (token, pick), as the HOST backend reports it): a masked pick counts
// nowhere, a bad one is reported whatever the mask.
__device__ __forceinline__ void count_pick(const DispatchParams& p, int32_t token, int k, int32_t id, int32_t* hist,
                                           uint64_t routable) {
  const GroupShape& s = p.ctx.shape;
  if (is_valid_expert(s, id)) {
    if (routable == ~uint64_t{0} || ((routable >> owner_of(s, id)) & 1u) != 0) atomicAdd(hist + id, 1);
  } else if (id != s.invalid_expert_id) {
    DeviceErrors* errors = &p.ctx.control()->errors;
    atomicAdd(&errors->bad_id_count, 1u);
    const uint64_t position = static_cast<uint64_t>(token) * s.top_k + k;
    atomicMin(reinterpret_cast<unsigned long long*>(&errors->bad_id_first),
              static_cast<unsigned long long>((position << 32) | static_cast<uint32_t>(id)));
  }
}

// Counts every pick of a token, one load at a time (unrolled, the general
// kernel's register path spills more).
__device__ inline void count_picks(const DispatchParams& p, int32_t token, int32_t* hist, uint64_t routable) {
  const int top_k = p.ctx.shape.top_k;
  const int32_t* row = p.args.topk_ids + static_cast<int64_t>(token) * top_k;
#pragma unroll 1
  for (int k = 0; k < top_k; ++k) count_pick(p, token, k, __ldg(row + k), hist, routable);
}

// One round of kBlockThreads tokens starting at `base`: per-rank counts of
// the round, then the slots of the own tokens [t0, t1) in it.
__device__ inline void route_round(const DispatchParams& p, int base, uint64_t mask, int t0, int t1,
                                   RoutingShared& sh) {
  const int world = p.ctx.shape.world_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = base + static_cast<int>(threadIdx.x);
  for (int d = 0; d < world; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) sh.warp_counts[warp][d] = __popc(ballot);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    uint32_t running = sh.totals[d];
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      sh.warp_offsets[w][d] = running;
      running += sh.warp_counts[w][d];
    }
    sh.totals[d] = running;
  }
  __syncthreads();
  if (base >= t1 || base + kBlockThreads <= t0) return;  // block-uniform: no own token in this round
  const bool own = t >= t0 && t < t1;
  const uint32_t lanes_below = (1u << lane) - 1u;
  int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t) * world;
  for (int d = 0; d < world; ++d) {
    const bool goes = (mask >> d) & 1u;
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, goes);
    const uint32_t earlier = sh.warp_offsets[warp][d] + __popc(ballot & lanes_below);
    if (own) slots[d] = goes ? static_cast<int32_t>(earlier) : -1;
    if (t == t0) sh.before[d] = earlier;  // routed tokens before the block's first
  }
}

// Look-back, after routing: the block's own picks, counted in shared memory,
// added to the rank's global histogram, one add per expert that has any
// (each add by one thread, the whole block's picks in it).  Counting every
// pick straight into the global histogram sent every block's thousands of
// adds to the few lines that hold it, where they queued behind each other
// Ends with a barrier: the block's publication (a release after it)
// covers these adds.
__device__ void add_block_histogram(const DispatchParams& p, const RoutingShared& sh) {
  int32_t* global = p.ctx.local<int32_t>(p.ctx.offsets.expert_hist);
  for (int x = threadIdx.x; x < p.ctx.shape.num_experts; x += blockDim.x) {
    const int32_t n = sh.histogram[x];
    if (n != 0) atomicAdd(global + x, n);
  }
  __syncthreads();
}

// General kernel, step 1: the tokens [from, t1), kBlockThreads per round:
// the slots of the own tokens [t0, t1) among the routed ones into token_slots,
// sh.totals = how many routed tokens go to each rank, sh.before = how many of
// [from, t0).  Look-back (from = t0): every block counts its own picks (with
// the bad-id report) and adds them to the global histogram; scan (from = 0):
// block G - 1, which routes every token, counts them all.  Counts go to
// shared memory where the experts fit (histogram_of), else straight to the
// global histogram.  The ids of kRoundsPerPass rounds are loaded before the
// first is used (latency).  Ends with a barrier.
__device__ void route_tokens(const DispatchParams& p, int from, int t0, int t1, RoutingShared& sh,
                             DispatchTrace& trace) {
  const GroupShape& s = p.ctx.shape;
  const bool counts_picks = p.args.lookback != 0 || sh.logical == static_cast<int32_t>(gridDim.x) - 1;
  int32_t* hist = histogram_of(p, sh);
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) {
    sh.totals[d] = 0;
    sh.before[d] = 0;
  }
  if (counts_picks && hist == sh.histogram) {
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) sh.histogram[x] = 0;
  }
  const uint64_t routable = routable_ranks(p);
  __syncthreads();
  trace.mark(DispatchTrace::kSetUp);
  for (int pass = from; pass < t1; pass += kBlockThreads * kRoundsPerPass) {
    uint64_t masks[kRoundsPerPass];
#pragma unroll
    for (int i = 0; i < kRoundsPerPass; ++i) {
      const int t = pass + i * kBlockThreads + static_cast<int>(threadIdx.x);
      masks[i] = t < t1 ? token_mask(s, p.args.topk_ids + static_cast<int64_t>(t) * s.top_k, routable) : 0;
    }
    if (counts_picks) {
#pragma unroll
      for (int i = 0; i < kRoundsPerPass; ++i) {
        const int t = pass + i * kBlockThreads + static_cast<int>(threadIdx.x);
        if (t < t1) count_picks(p, t, hist, routable);
      }
    }
#pragma unroll
    for (int i = 0; i < kRoundsPerPass; ++i) {
      const int base = pass + i * kBlockThreads;
      if (base < t1) route_round(p, base, masks[i], t0, t1, sh);
    }
  }
  if (t0 == t1) {  // no own token: every routed token is before the block's (none are, on a look-back)
    for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) sh.before[d] = sh.totals[d];
  }
  __syncthreads();  // totals, before final; histogram adds issued
  if (p.args.lookback != 0 && hist == sh.histogram) add_block_histogram(p, sh);
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
