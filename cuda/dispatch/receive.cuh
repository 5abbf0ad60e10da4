// The receive side: block 0 waits for every rank's arrivals and produces the
// call's counts.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/device_sync.cuh"
#include "dispatch/counts.cuh"
#include "dispatch/diagnostics.cuh"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// The segments of absent sources (ControlBlock::absent_ranks), which no
// peer writes any more: every row padding, their EPLB rows zero.  The
// absent source's per-expert counts stay at the zeros the survivors'
// resynchronisation left.  (picks = tokens_per_rank * top_k < 2^31.)
__device__ void pad_absent_sources(const DispatchParams& p, uint64_t absent) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int32_t picks = p.args.tokens_per_rank * s.top_k;
  for (uint64_t left = absent; left != 0; left &= left - 1) {
    const int src = __ffsll(static_cast<long long>(left)) - 1;
    int32_t* ids = c.local<int32_t>(c.offsets.recv_ids) + static_cast<int64_t>(src) * picks;
    float* weights = c.local<float>(c.offsets.recv_weights) + static_cast<int64_t>(src) * picks;
    for (int32_t i = threadIdx.x; i < picks; i += blockDim.x) {
      ids[i] = s.invalid_expert_id;
      weights[i] = 0.0f;
    }
    if (s.eplb_enabled) {
      int32_t* eplb = c.local<int32_t>(c.offsets.eplb_gathered) + static_cast<int64_t>(src) * s.num_experts;
      for (int32_t x = threadIdx.x; x < s.num_experts; x += blockDim.x) eplb[x] = 0;
    }
  }
}

// Block 0, last: wait until every rank's blocks have all arrived here, then
// produce recv_counts and local_expert_counts.  One barrier after every wait,
// then every count load in one round (L2 loads, ordered after the waits'
// acquires by the barrier).  `wait_ok` is shared memory of kMaxWorldSize
// entries.  (epoch was read at kernel start: only this block of the previous
// call wrote it, and this one writes it once every block of the rank has
// arrived, so after each has read it.)  `zero_histogram`: the small kernel
// leaves the global histogram at zero here (large E); the general kernel's
// last block does it (send_totals).
// kReleasable: the split receive kernel's waits (bounded_wait).
template <bool kReleasable = false>
__device__ void finish_dispatch(const DispatchParams& p, uint64_t epoch, RoutingShared& sh, uint32_t* wait_ok,
                                bool zero_histogram, DispatchTrace& trace) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int world = s.world_size, epr = s.experts_per_rank;
  for (int src = threadIdx.x; src < world; src += blockDim.x) {
    const uint64_t* arrivals = c.local<uint64_t>(c.offsets.dispatch_arrivals) + src;
    // An absent source sends nothing: no rows (wait_ok 0 counts none), no wait.
    wait_ok[src] = ((sh.absent >> src) & 1u) == 0 && wait_until_at_least<kReleasable, false>(
                                                         arrivals, epoch * kArrivalsPerCall, c.control(),
                                                         c.state.mirror, c.state.timeout_ns, kPhaseDispatch, src)
                       ? 1u
                       : 0u;
  }
  if (sh.absent != 0) pad_absent_sources(p, sh.absent);
  if (zero_histogram && s.num_experts > kSharedHistogram) {  // the global histogram starts the next call at zero
    int32_t* hist = histogram_of(p, sh);
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) hist[x] = 0;
  }
  __syncthreads();
  trace.mark_waited();
  const uint64_t* counts_in = c.local<uint64_t>(c.offsets.dispatch_counts_in);
  const int32_t* experts_in = c.local<int32_t>(c.offsets.expert_counts_in);
  const int src = threadIdx.x;  // world <= kMaxWorldSize < kBlockThreads
  const int32_t count =
      src < world && wait_ok[src] != 0 ? accepted_rows(c, src, __ldcg(counts_in + src), p.args.tokens_per_rank) : 0;
  int32_t* local_expert_counts = c.local<int32_t>(c.offsets.local_expert_counts);
  for (int e = threadIdx.x; e < epr; e += blockDim.x) {
    int32_t sum = 0;
    for (int q = 0; q < world; ++q) sum += __ldcg(experts_in + q * epr + e);
    local_expert_counts[e] = sum;
  }
  if (src < world) {
    c.local<int32_t>(c.offsets.recv_counts)[src] = count;
    c.local<int32_t>(c.offsets.counts_private)[src] = count;
  }
  if (threadIdx.x == 0) c.control()->epoch = epoch;  // combine reads it; the next dispatch advances it
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
