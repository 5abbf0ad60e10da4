// The receive half of a split dispatch: what block 0 of the fused kernels
// does last (wait for every rank's arrivals, write the counts), as a kernel
// of its own, launched after the send kernel of the slot has ended and, where
// the driver has stream memory operations, after the slot's stream wait on
// its ready word (common/split_ready.cuh), so that the SMs are free while the
// rows travel.  The call's epoch and look-back tag advance here, as the fused
// kernels advance them once every block has read them.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/kernel_launch.cuh"
#include "common/split_ready.cuh"
#include "dispatch/diagnostics.cuh"
#include "dispatch/params.cuh"
#include "dispatch/receive.cuh"

namespace moe_ep {
namespace kernels {
namespace {

__global__ void __launch_bounds__(kBlockThreads, 1) dispatch_receive_kernel(const DispatchParams p) {
  __shared__ RoutingShared sh;  // finish_dispatch's view of the histogram (global beyond kSharedHistogram)
  __shared__ uint32_t wait_ok[kMaxWorldSize];
  wait_for_prior_grid();
  allow_dependent_launch();
  ControlBlock* control = p.ctx.control();
  DispatchTrace trace(p);
  if (threadIdx.x == 0) sh.absent = absent_ranks(control);
  __syncthreads();
  if (!handle_timed_out(control)) {  // uniform: only the kernels of this stream write it, and they have ended
    const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch) + 1;
    // The small send kernel leaves the global histogram for this block to zero.
    finish_dispatch<true>(p, epoch, sh, wait_ok, p.args.small_batch != 0, trace);
    if (threadIdx.x == 0 && p.args.lookback != 0) control->lookback_tag += 1u;  // the send kernel's tag
  }
  __syncthreads();  // after every wait
  if (threadIdx.x == 0) end_receive(p.ctx, p.ctx.offsets.dispatch_ready);
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
