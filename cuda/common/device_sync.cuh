// Memory-ordering primitives and bounded waits shared by the kernels.
//
// Protocol in short (docs/nvlink_backend.md has the argument): data rows are
// written to a peer with plain stores; the block then meets at a barrier and
// one thread publishes with a system-scope release (a fence followed by a
// flag store or a counter add).  The barrier orders every thread's stores
// before that release (the same reasoning as a cooperative grid sync), so a
// receiver whose system-scope acquire load sees the flag sees the rows.
#pragma once

#include <stdint.h>

#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t load_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t load_relaxed_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Between the blocks of one grid (the dispatch look-back): device scope.
__device__ __forceinline__ uint64_t load_relaxed_gpu(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release_gpu(uint64_t* p, uint64_t v) {
  asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

__device__ __forceinline__ int32_t load_relaxed_sys(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Records the first timeout of the handle: device record (the host reads it
// after synchronising) and host-mapped mirror (read without synchronising).
__device__ inline void record_timeout(ControlBlock* control, HostTimeoutMirror* mirror, uint32_t phase, int32_t peer) {
  if (atomicCAS(&control->errors.timeout_phase, kPhaseNone, phase) == kPhaseNone) {
    atomicExch(&control->errors.timeout_peer, peer);
    mirror->timeout_peer = peer;
    __threadfence_system();
    mirror->timeout_phase = phase;
  }
}

// Whether an earlier call of this handle timed out: later kernels then do no
// work and wait for nobody (the group is out of step; the host reports it).
__device__ __forceinline__ bool handle_timed_out(const ControlBlock* control) {
  return *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase) != kPhaseNone;
}

// The ranks that take no part in the protocol any more
// (ControlBlock::absent_ranks); the host changes the word only while no
// kernel of the handle runs.
__device__ __forceinline__ uint64_t absent_ranks(const ControlBlock* control) {
  return __ldg(reinterpret_cast<const unsigned long long*>(&control->absent_ranks));
}

// Whether the host's watchdog released a receive half's stream wait: the
// peers missed timeout_ms already, so a wait for them gives up at once.
__device__ __forceinline__ bool watchdog_released(const ControlBlock* control) {
  return *reinterpret_cast<const volatile uint32_t*>(&control->watchdog_released) != 0u;
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

__device__ __forceinline__ void red_release_sys_add(uint64_t* p, uint64_t v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Relaxed add at system scope.  After a fence.acq_rel.sys by the same thread
// it is a release pattern (PTX memory model): several of them after one fence
// publish to several ranks at the price of one fence, where each
// red.release would fence again (and wait for the previous add's round trip).
__device__ __forceinline__ void red_relaxed_sys_add(uint64_t* p, uint64_t v) {
  asm volatile("red.relaxed.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Spins until ready() (which polls the memory), reading the clock only every
// 256 polls (it is slow to read); gives up at the deadline or as soon as
// another wait of this handle gave up, and records (phase, peer) on a timeout.
// kReleasable: a receive half's wait, which also gives up once the host's
// watchdog released the slot (a template argument: the fused kernels' waits
// compile as if the split did not exist).
// A wait for an absent peer (ControlBlock::absent_ranks) is over after a few
// polls; kPeerMayBeAbsent = false where the caller knows the peer takes part.
template <bool kReleasable = false, bool kPeerMayBeAbsent = true, typename Ready>
__device__ inline bool bounded_wait(const Ready& ready, ControlBlock* control, HostTimeoutMirror* mirror,
                                    int64_t timeout_ns, uint32_t phase, int32_t peer) {
  if (ready()) return true;
  // Issued now, looked at a few polls later: the load costs no wait.
  const uint64_t absent = kPeerMayBeAbsent && peer >= 0 ? absent_ranks(control) : 0;
  const uint64_t start = global_timer_ns();
  for (uint32_t polls = 1;; ++polls) {
    if (ready()) return true;
    if (polls == 4 && ((absent >> (peer & 63)) & 1u) != 0) return true;
    if (polls > 64) __nanosleep(32);  // many waiters: leave the memory system to the data
    if ((polls & 255u) == 0) {
      if (handle_timed_out(control)) return false;
      if (static_cast<int64_t>(global_timer_ns() - start) > timeout_ns || (kReleasable && watchdog_released(control))) {
        record_timeout(control, mirror, phase, peer);
        return false;
      }
    }
  }
}

// Spins until *word >= target (acquire), bounded as above.
template <bool kReleasable = false, bool kPeerMayBeAbsent = true>
__device__ inline bool wait_until_at_least(const uint64_t* word, uint64_t target, ControlBlock* control,
                                           HostTimeoutMirror* mirror, int64_t timeout_ns, uint32_t phase,
                                           int32_t peer) {
  return bounded_wait<kReleasable, kPeerMayBeAbsent>([&] { return load_acquire_sys(word) >= target; }, control, mirror,
                                                     timeout_ns, phase, peer);
}

// Relaxed 32-bit add at system scope (a split call's ready word; after a
// fence.acq_rel.sys it is a release pattern, as red_relaxed_sys_add).
__device__ __forceinline__ void red_relaxed_sys_add(uint32_t* p, uint32_t v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t arrival_weight() {
  return blockIdx.x == 0 ? kArrivalsPerCall - (gridDim.x - 1) : 1;
}

}  // namespace kernels
}  // namespace moe_ep
