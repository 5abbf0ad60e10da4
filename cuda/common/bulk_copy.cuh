// Bulk asynchronous copies from global memory (local or a peer's, over
// NVLink) into shared memory, completed on a shared-memory barrier, and from
// shared memory into global memory, completed in bulk groups (compute
// capability 9.0 and newer: cp.async.bulk and mbarrier).
//
// Why: a warp that loads into registers can keep only a few KiB in flight, so
// a handful of SMs cannot cover NVLink's latency; a bulk copy is issued by one
// thread, costs no registers, and is limited only by the shared memory given
// to it.  One barrier per buffer: the issuing thread announces the bytes
// (expect_tx) and starts the copy; the copy's completion flips the barrier's
// phase, which the consuming threads wait for with the phase's parity.
#pragma once

#include <stdint.h>

#include "common/device_sync.cuh"

namespace moe_ep {
namespace kernels {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MOE_EP_HAVE_BULK_COPY 1
#endif

#ifdef MOE_EP_HAVE_BULK_COPY
// One thread: a barrier that completes a phase after `arrivals` arrivals
// (plus, for a copy's barrier, the announced bytes).
__device__ __forceinline__ void barrier_init(uint64_t* barrier, uint32_t arrivals = 1) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
}

// One arrival on `barrier` (release: this thread's earlier shared-memory
// accesses are ordered before the phase completes for the waiters).
__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}

// After barrier_init, before any copy uses the barriers: makes the
// initialisation visible to the copy engine (the async proxy).
__device__ __forceinline__ void barrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// Orders what this thread (and, after a barrier, the threads it synchronised
// with) learnt through generic loads, such as an acquire of a peer's flag,
// before its later bulk copies from global memory.  Once per kernel, after
// the acquire: it may wait for the thread's outstanding global stores.
__device__ __forceinline__ void fence_global_before_bulk_copies() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

// Orders the warp's generic reads of a shared-memory buffer (after a warp
// sync) before the bulk copy that refills it.
__device__ __forceinline__ void fence_shared_before_bulk_copy() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// One thread: announces `bytes` more to land on `barrier` in its current
// phase (the arrival of the copy's issuing thread).
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}

// One thread: starts a copy of `bytes` (a multiple of 16; both addresses
// 16-byte aligned) from global `src` into shared `dst` that completes its
// bytes on `barrier` (announced with barrier_expect_bytes).
__device__ __forceinline__ void bulk_copy_issue(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}

// One thread: copies `bytes` from global `src` into shared `dst`, completing
// on `barrier`.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
  barrier_expect_bytes(barrier, bytes);
  bulk_copy_issue(dst, src, bytes, barrier);
}

// Small asynchronous copies (4 bytes per thread, global to shared), waited
// for by the issuing thread with commit groups; other threads of the warp see
// them after that thread's wait and a __syncwarp.
__device__ __forceinline__ void copy_async_4_to_shared(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits for every committed group but the newest.
__device__ __forceinline__ void copy_async_wait_all_but_newest() {
  asm volatile("cp.async.wait_group 1;" ::: "memory");
}
// Waits for every committed group (before leaving, so that nothing is still
// being written into shared memory).
__device__ __forceinline__ void copy_async_drain() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// One thread: the same as bulk_copy_issue, as several copies of at most
// `chunk` bytes (a multiple of 16) completing on the one barrier (whose bytes
// the caller announced).
__device__ __forceinline__ void bulk_copy_chunks_issue(void* dst, const void* src, uint32_t bytes, uint32_t chunk,
                                                       uint64_t* barrier) {
  for (uint32_t offset = 0; offset < bytes; offset += chunk) {
    bulk_copy_issue(static_cast<char*>(dst) + offset, static_cast<const char*>(src) + offset,
                    bytes - offset < chunk ? bytes - offset : chunk, barrier);
  }
}

// One thread: copies `bytes` (a multiple of 16; both addresses 16-byte
// aligned) from shared `src` to global `dst` (local memory or a peer's, over
// NVLink), as part of this thread's current bulk group.  The copy reads `src`
// some time after the call: the buffer may be rewritten only after
// bulk_wait_groups_read says so.
__device__ __forceinline__ void bulk_copy_to_global(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(shared_address(src)),
               "r"(bytes)
               : "memory");
}

// Closes this thread's current bulk group (the copies issued since the last
// commit).
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most `kPending` of this thread's newest bulk groups still
// read their shared-memory sources (the older groups' buffers may be reused).
// A hardware wait for the thread's own copies, which read local shared memory
// and always finish: no timeout applies, as for a fence.
template <int kPending>
__device__ __forceinline__ void bulk_wait_groups_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}

// Waits until every bulk group of this thread is complete (its writes
// performed), then orders them, as seen by this thread, before its later
// generic accesses: after it the writes are covered by a barrier and a
// release exactly like the thread's ordinary stores.  Like a fence, a
// hardware wait (a peer's mapped memory always accepts the writes).
__device__ __forceinline__ void bulk_wait_all_written() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ bool barrier_try_wait(uint64_t* barrier, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(shared_address(barrier)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits for the phase of `barrier` with this parity to complete; false after
// timeout_ns (the copy reads mapped memory, so it always completes; the bound
// is the rule for every device-side wait).
__device__ inline bool barrier_wait(uint64_t* barrier, uint32_t parity, int64_t timeout_ns) {
  if (barrier_try_wait(barrier, parity)) return true;
  const uint64_t start = global_timer_ns();
  for (uint32_t polls = 1;; ++polls) {
    if (barrier_try_wait(barrier, parity)) return true;
    if ((polls & 1023u) == 0 && static_cast<int64_t>(global_timer_ns() - start) > timeout_ns) return false;
  }
}
#endif

}  // namespace kernels
}  // namespace moe_ep
