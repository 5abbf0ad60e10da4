// The general kernel's decoupled look-back (step 2): a block publishes its
// count per destination and reads those of the blocks before it
// (dispatch/lookback.h holds the words' arithmetic).
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/device_sync.cuh"
#include "dispatch/lookback.h"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Step 2a: block L's count per destination, tagged with the call.  A release
// per word (after the barrier that ended routing): whoever sees the word sees
// the block's histogram adds.
__device__ __forceinline__ void publish_own_counts(const DispatchParams& p, const RoutingShared& sh) {
  const int world = p.ctx.shape.world_size;
  uint64_t* words = p.ctx.local<uint64_t>(p.ctx.offsets.dispatch_lookback) + static_cast<int64_t>(sh.logical) * world;
  for (int d = threadIdx.x; d < world; d += blockDim.x)
    store_release_gpu(words + d, lookback_word(sh.tag, sh.totals[d]));
}

// Step 2b: sh.before = the counts of blocks 0 .. L - 1 per destination.  Each
// thread loads up to 4 words at once (relaxed), waits for those not yet this
// call's, and acquires them all with one fence.  A block whose wait timed out
// (recorded) returns false with the rest of the block: it sends nothing.
constexpr int kLookbackLoads = 4;
__device__ bool look_back(const DispatchParams& p, RoutingShared& sh) {
  const KernelContext& c = p.ctx;
  const int world = c.shape.world_size;
  const uint32_t tag = sh.tag;
  const uint64_t* words = c.local<uint64_t>(c.offsets.dispatch_lookback);
  const int n = sh.logical * world;
  bool ok = true;
  for (int first = threadIdx.x; first < n; first += kLookbackLoads * kBlockThreads) {
    uint64_t w[kLookbackLoads];
#pragma unroll
    for (int u = 0; u < kLookbackLoads; ++u) {
      const int i = first + u * kBlockThreads;
      w[u] = i < n ? load_relaxed_gpu(words + i) : 0;
    }
#pragma unroll
    for (int u = 0; u < kLookbackLoads; ++u) {
      const int i = first + u * kBlockThreads;
      if (i >= n || !ok) continue;
      if (!lookback_word_is_current(w[u], tag)) {
        uint64_t* seen = &w[u];
        ok = bounded_wait<false, false>(  // this rank's own blocks: never absent
            [&] {
              *seen = load_relaxed_gpu(words + i);
              return lookback_word_is_current(*seen, tag);
            },
            c.control(), c.state.mirror, c.state.timeout_ns, kPhaseDispatch, c.shape.rank);
      }
      if (ok) atomicAdd(&sh.before[i % world], lookback_count(w[u]));
    }
  }
  fence_acq_rel_gpu();  // the words' publishers' histogram adds are visible to this block
  return __syncthreads_or(ok ? 0 : 1) == 0;
}

// A token's destinations for the sends: its slots (token_slots), after a
// look-back placed after the earlier blocks' tokens.
__device__ __forceinline__ TokenDestinations placed_destinations(const DispatchParams& p, const int32_t* slots_row,
                                                                 const RoutingShared& sh, int world, int lane) {
  TokenDestinations d = TokenDestinations::load(slots_row, world, lane);
  if (p.args.lookback != 0) {
    if (d.slot_low >= 0) d.slot_low += static_cast<int32_t>(sh.before[lane]);
    if (d.slot_high >= 0) d.slot_high += static_cast<int32_t>(sh.before[lane + 32]);
  }
  return d;
}

// After a look-back's sends (behind a barrier: nothing reads them any more),
// the own tokens' slots in token_slots become the final ones, which combine
// reads.
__device__ void store_placed_slots(const DispatchParams& p, int t0, int t1, const RoutingShared& sh) {
  if (p.args.lookback == 0 || sh.logical == 0) return;  // already final; nothing before block 0
  const int world = p.ctx.shape.world_size;
  int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t0) * world;
  const int n = (t1 - t0) * world;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t v = slots[i];
    if (v >= 0) slots[i] = v + static_cast<int32_t>(sh.before[i % world]);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
