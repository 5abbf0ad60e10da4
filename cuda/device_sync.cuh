// Memory-ordering primitives and bounded waits shared by the kernels.
//
// Protocol in short (docs/nvlink_backend.md has the argument): data rows are
// written to a peer with plain stores; each writing thread then executes a
// system-scope fence and the block meets at a barrier, so that the one thread
// that publishes a flag with a system-scope release store makes every row of
// the block visible before the flag.  Receivers read flags with system-scope
// acquire loads.
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

__device__ __forceinline__ int32_t load_relaxed_sys(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_relaxed_sys(int32_t* p, int32_t v) {
  asm volatile("st.relaxed.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Reads a value another block of this grid wrote (through L2, not L1).
__device__ __forceinline__ int32_t load_from_l2(const int32_t* p) { return __ldcg(p); }

// Records the first timeout of the handle: device record (the host reads it
// after synchronising) and host-mapped mirror (read without synchronising).
__device__ inline void record_timeout(ControlBlock* control, HostTimeoutMirror* mirror, uint32_t phase,
                                      int32_t peer) {
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

// Spins until flag->epoch >= epoch.  Reads the clock only every 256 polls
// (it is slow to read), gives up at the deadline or as soon as another wait of
// this handle gave up, and records (phase, peer) on a timeout.
__device__ inline bool wait_for_flag(const FlagSlot* flag, uint64_t epoch, ControlBlock* control,
                                     HostTimeoutMirror* mirror, int64_t timeout_ns, uint32_t phase,
                                     int32_t peer) {
  if (load_acquire_sys(&flag->epoch) >= epoch) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t polls = 1;; ++polls) {
    if (load_acquire_sys(&flag->epoch) >= epoch) return true;
    if ((polls & 255u) == 0) {
      if (handle_timed_out(control)) return false;
      if (static_cast<int64_t>(global_timer_ns() - start) > timeout_ns) {
        record_timeout(control, mirror, phase, peer);
        return false;
      }
    }
  }
}

// Every thread of the block calls this after its last store to a peer; then
// thread 0 may publish with a release store (or count the block in).
__device__ __forceinline__ void block_publish_barrier() {
  __threadfence_system();
  __syncthreads();
}

// Counts the block as done with its stores.  Returns true in every thread of
// the last block to arrive, which then sees all other blocks' writes.
// The counter is reset by that last block, so it starts at 0 in every launch.
__device__ inline bool arrive_last(uint32_t* counter, uint32_t num_blocks) {
  __shared__ uint32_t is_last;
  block_publish_barrier();
  if (threadIdx.x == 0) {
    const uint32_t before = atomicAdd(counter, 1u);
    is_last = before == num_blocks - 1 ? 1u : 0u;
    if (is_last) {
      __threadfence();
      *counter = 0;  // every block has arrived: no more increments in this launch
    }
  }
  __syncthreads();
  if (is_last) __threadfence();
  return is_last != 0;
}

}  // namespace kernels
}  // namespace moe_ep
