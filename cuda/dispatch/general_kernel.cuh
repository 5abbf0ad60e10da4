// The general dispatch kernel (dispatch/dispatch.cu describes its steps).
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/kernel_launch.cuh"
#include "dispatch/counts.cuh"
#include "dispatch/diagnostics.cuh"
#include "dispatch/lookback.cuh"
#include "dispatch/padding.cuh"
#include "dispatch/params.cuh"
#include "dispatch/receive.cuh"
#include "dispatch/routing.cuh"
#include "dispatch/row_send.cuh"
#include "dispatch/token_shares.h"

namespace moe_ep {
namespace kernels {
namespace {

// Thread 0: this block's logical index; the block that draws the last one
// sets the ticket back to 0 for the next call (every block of this grid has
// drawn by then, and the next dispatch starts after this grid has completed).
__device__ __forceinline__ int32_t draw_logical_block(ControlBlock* control) {
  const uint32_t L = atomicAdd(&control->dispatch_ticket, 1u);
  if (L == gridDim.x - 1) atomicExch(&control->dispatch_ticket, 0u);
  return static_cast<int32_t>(L);
}

// kSendHalf: a split dispatch's send half (DispatchLaunch::part), which ends
// after its publication; dispatch/receive_kernel.cuh does the rest.
template <typename Segments, bool kSendHalf>
__global__ void __launch_bounds__(kBlockThreads, 1) dispatch_kernel(const DispatchParams p) {
  __shared__ RoutingShared sh;
  __shared__ uint32_t wait_ok[kMaxWorldSize];
  wait_for_prior_grid();
  allow_dependent_launch();
  ControlBlock* control = p.ctx.control();
  DispatchTrace trace(p);
  const bool lookback = p.args.lookback != 0;
  if (threadIdx.x == 0) {
    sh.logical = lookback ? draw_logical_block(control) : static_cast<int32_t>(blockIdx.x);
    sh.timed_out = *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase);
    sh.epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch) + 1;
    sh.tag = *reinterpret_cast<const volatile uint32_t*>(&control->lookback_tag) + 1u;
    sh.absent = absent_ranks(control);
  }
  __syncthreads();
  if (sh.timed_out != kPhaseNone) return;  // block-uniform; the ticket was drawn (and reset)
  int32_t t0, t1;
  own_token_range(p.args.num_tokens, gridDim.x, sh.logical, kTokenShareUnit, p.args.last_block_share, &t0, &t1);
  Segments segments(p, t0, t1, segment_shared);
  segments.start();
  route_tokens(p, lookback ? t0 : 0, t0, t1, sh, trace);  // ends with a barrier
  trace.mark(DispatchTrace::kFirstRound);
  if (lookback) {
    publish_own_counts(p, sh);
    if (!look_back(p, sh)) {  // block-uniform; a timeout was recorded
      segments.abandon();
      return;
    }
  }
  trace.mark(DispatchTrace::kRouted);
  if (sh.logical == static_cast<int32_t>(gridDim.x) - 1) send_totals(p, sh);
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int world = p.ctx.shape.world_size;
  send_own_tokens(p, t0, t1, segments, [&](int32_t token, int lane) {
    return placed_destinations(p, slots + static_cast<int64_t>(token) * world, sh, world, lane);
  });
  trace.mark(DispatchTrace::kSent);
  write_block_padding(p, t0, t1, sh.logical, [&](int d) {
    return BoundRows{static_cast<int32_t>(sh.before[d]), static_cast<int32_t>(rows_through_own(p, sh, d))};
  });
  trace.mark(DispatchTrace::kPadded);
  trace.store();
  publish_block_arrival<kSendHalf>(p.ctx, sh.absent, p.ctx.offsets.dispatch_arrivals,
                                   p.ctx.offsets.dispatch_ready);  // step 4 (starts with a barrier)
  trace.mark_published();
  store_placed_slots(p, t0, t1, sh);
  if (blockIdx.x == 0 && !kSendHalf) {
    finish_dispatch(p, sh.epoch, sh, wait_ok, false, trace);
    if (lookback && threadIdx.x == 0) control->lookback_tag = sh.tag;  // as the epoch: every block has read it
    trace.print(sh.epoch);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
