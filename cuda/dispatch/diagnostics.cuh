// Dispatch's timing diagnostics, compiled only in measurement builds (the
// CMake option MOE_EP_DIAGNOSTICS); in any other build every call below
// compiles to nothing.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>
#ifdef MOE_EP_DIAGNOSTICS
#include <stdio.h>  // DispatchTrace prints
#endif

#include "common/device_sync.cuh"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Measurement builds only (MOE_EP_DIAGNOSTICS, MOE_EP_DISPATCH_DIAGNOSTIC
// bit 4): per-block phase times, in both kernels.  Thread 0 of every block
// stamps the global timer (ns) at the marks below and stores its stamps before
// the block's publication; block 0, once every block of the rank has arrived,
// prints a line per block: "dtrace RANK EPOCH BLOCK", the stamps, and block
// 0's own publication, end of its waits and end (0 on other blocks).
// (Printing from every block would perturb the timing: the stamps are
// gathered instead.)  In other builds the class is
// empty and every call compiles to nothing.
#ifdef MOE_EP_DIAGNOSTICS
constexpr int kTraceRanks = 8, kTraceBlocks = 1024, kTraceMarks = 6;
__device__ uint64_t dispatch_trace_stamps[kTraceRanks][kTraceBlocks][kTraceMarks];
#endif

class DispatchTrace {
 public:
  enum Mark { kStart, kSetUp, kFirstRound, kRouted, kSent, kPadded, kMarks };

#ifdef MOE_EP_DIAGNOSTICS
  __device__ explicit DispatchTrace(const DispatchParams& p)
      : p_(p), on_((p.args.diagnostic & 4) != 0 && threadIdx.x == 0 && blockIdx.x < kTraceBlocks) {
    mark(kStart);
  }
  __device__ void mark(Mark m) {
    if (on_) stamps_[m] = global_timer_ns();
  }
  __device__ void store() const {
    if (!on_) return;
    for (int i = 0; i < kMarks; ++i) dispatch_trace_stamps[p_.ctx.shape.rank % kTraceRanks][blockIdx.x][i] = stamps_[i];
  }
  // Block 0 only, after the block's publication and after its waits.
  __device__ void mark_published() {
    if (on_) published_ = global_timer_ns();
  }
  __device__ void mark_waited() {
    if (on_) waited_ = global_timer_ns();
  }
  __device__ void print(uint64_t epoch) const {
    if (!on_ || blockIdx.x != 0) return;
    const unsigned long long done = global_timer_ns();
    const int rank = p_.ctx.shape.rank;
    for (int b = 0; b < static_cast<int>(gridDim.x) && b < kTraceBlocks; ++b) {
      const volatile uint64_t* t = dispatch_trace_stamps[rank % kTraceRanks][b];
      printf("dtrace %d %llu %d %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", rank,
             static_cast<unsigned long long>(epoch), b, static_cast<unsigned long long>(t[0]),
             static_cast<unsigned long long>(t[1]), static_cast<unsigned long long>(t[2]),
             static_cast<unsigned long long>(t[3]), static_cast<unsigned long long>(t[4]),
             static_cast<unsigned long long>(t[5]), b == 0 ? static_cast<unsigned long long>(published_) : 0ull,
             b == 0 ? static_cast<unsigned long long>(waited_) : 0ull, b == 0 ? done : 0ull);
    }
  }

 private:
  static_assert(kMarks == kTraceMarks, "one stamp per mark");
  const DispatchParams& p_;
  const bool on_;
  uint64_t stamps_[kMarks] = {};
  uint64_t published_ = 0;
  uint64_t waited_ = 0;
#else
  __device__ explicit DispatchTrace(const DispatchParams&) {}
  __device__ void mark(Mark) {}
  __device__ void store() const {}
  __device__ void mark_published() {}
  __device__ void mark_waited() {}
  __device__ void print(uint64_t) const {}
#endif
};

// Measurement builds only (MOE_EP_DIAGNOSTICS): the ranks whose
// hidden rows are left unwritten, to time the rest (results are then wrong).
__device__ __forceinline__ uint64_t rows_left_out(const DispatchParams& p) {
#ifdef MOE_EP_DIAGNOSTICS
  const uint64_t own = uint64_t{1} << p.ctx.shape.rank;
  const int which = p.args.diagnostic & 3;
  return which == 1 ? own : which == 2 ? ~own : 0;
#else
  (void)p;
  return 0;
#endif
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
