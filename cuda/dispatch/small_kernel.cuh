// The small-batch dispatch kernel (tokens_per_rank <= kSmallDispatchMaxTokens).
// The same work, protocol, counters and results as dispatch_kernel, with fewer
// dependent steps on the path of a small call (docs/nvlink_backend.md):
// the routing is one round (T <= kBlockThreads); a token's slots are derived
// from the shared ballots instead of being read back from token_slots (which
// is still written: combine reads it); the timeout record waits in a register
// instead of holding up routing's first barrier; the own tokens' weight rows
// are prefetched; block 0, which counts every pick, takes a smaller share of
// the tokens (none on small calls, so that its counts are not queued behind a
// row; small_first_block_share); and block 0's count loads after the waits
// are issued in one round.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/kernel_launch.cuh"
#include "dispatch/counts.cuh"
#include "dispatch/diagnostics.cuh"
#include "dispatch/padding.cuh"
#include "dispatch/params.cuh"
#include "dispatch/receive.cuh"
#include "dispatch/row_send.cuh"
#include "dispatch/small_routing.cuh"
#include "dispatch/token_shares.h"

namespace moe_ep {
namespace kernels {
namespace {

// kSendHalf as for dispatch_kernel.
template <typename Segments, bool kSendHalf>
__global__ void __launch_bounds__(kBlockThreads, 1) dispatch_small_kernel(const DispatchParams p) {
  __shared__ SmallShared sh;
  wait_for_prior_grid();
  allow_dependent_launch();
  DispatchTrace trace(p);
  ControlBlock* control = p.ctx.control();
  int32_t t0, t1;  // block 0 counts every pick first: a smaller share, none on small calls
  own_token_range(p.args.num_tokens, gridDim.x, blockIdx.x, p.args.first_block_share, kTokenShareUnit, &t0, &t1);
  const uint32_t timed_out =
      threadIdx.x == 0 ? *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase) : 0u;
  const uint64_t epoch =
      blockIdx.x == 0 ? *reinterpret_cast<const volatile uint64_t*>(&control->epoch) + 1 : uint64_t{0};
  Segments segments(p, t0, t1, segment_shared);
  segments.start();
  if (p.args.topk_weights != nullptr) {
    for (int t = t0 + static_cast<int>(threadIdx.x); t < t1; t += blockDim.x) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(p.args.topk_weights + static_cast<int64_t>(t) * p.ctx.shape.top_k));
    }
  }
  trace.mark(DispatchTrace::kSetUp);
  route_small(p, t0, t1, timed_out, sh);  // ends with a barrier
  trace.mark(DispatchTrace::kFirstRound);
  if (sh.r.timed_out != kPhaseNone) {  // block-uniform
    segments.abandon();
    return;
  }
  if (blockIdx.x == 0) send_counts(p, sh.r.totals, histogram_of(p, sh.r));
  trace.mark(DispatchTrace::kRouted);
  const int world = p.ctx.shape.world_size;
  send_own_tokens(p, t0, t1, segments,
                  [&](int32_t token, int lane) { return small_destinations(sh, token, world, lane); });
  trace.mark(DispatchTrace::kSent);
  // Issued before the padding, used at the publication (block 0's receive
  // reads it from shared memory after publish_block_arrival's barrier).
  const uint64_t absent = threadIdx.x == 0 ? absent_ranks(control) : 0;
  write_block_padding(p, t0, t1, static_cast<int32_t>(blockIdx.x), [&](int d) {
    return BoundRows{small_bound_before(sh, t0, d), small_bound_before(sh, t1, d)};
  });
  trace.mark(DispatchTrace::kPadded);
  trace.store();
  if (threadIdx.x == 0) sh.r.absent = absent;
  publish_block_arrival<kSendHalf>(p.ctx, absent, p.ctx.offsets.dispatch_arrivals, p.ctx.offsets.dispatch_ready);
  trace.mark_published();
  if (blockIdx.x == 0 && !kSendHalf) {
    finish_dispatch(p, epoch, sh.r, sh.wait_ok, true, trace);
    trace.print(epoch);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
