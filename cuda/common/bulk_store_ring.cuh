// A warp's ring of shared-memory buffers that forwards chunks of global memory
// to one or more global destinations with bulk copies, without registers:
// each chunk is read once (global -> shared, completed on the buffer's
// mbarrier) and written to every destination (shared -> global, one bulk
// group per chunk).  Only one thread of the warp (the issuing lane) calls it.
//
// Why: a warp that copies through registers keeps one 4 KiB segment in
// flight and waits for its load before its stores, so a few SMs leave NVLink
// idle between loads (docs/nvlink_backend.md).  Here a warp keeps
// kStages - 1 loads in flight ahead of its stores, and the stores leave shared
// memory on their own.
//
// Sequence, for chunks numbered 0, 1, 2, ... in the order they are stored:
//   load(0) ... load(kStages - 2)                    before anything else
//   for n: wait_loaded(n); store(n, dst)...; end_stores(); load(n + kStages - 1)
//   wait_all_written()                               before the publication
// end_stores() waits until the stores of chunk n - 1 have read their buffer,
// which is the one load(n + kStages - 1) refills; the buffer is touched only
// by bulk copies (the async proxy), so no proxy fence is needed between them.
#pragma once

#include <stdint.h>

#include "common/bulk_copy.cuh"

namespace moe_ep {
namespace kernels {

#ifdef MOE_EP_HAVE_BULK_COPY
template <int kStages, int kStageBytes>
class BulkStoreRing {
  static_assert(kStages >= 2, "one buffer loads while another stores");
  static_assert(kStageBytes % 16 == 0, "bulk copies move multiples of 16 bytes");

 public:
  // Shared memory of one warp's ring: the buffers, then the barriers.
  static constexpr size_t kBufferBytes = size_t{kStages} * kStageBytes;
  static constexpr size_t kBarrierBytes = size_t{kStages} * sizeof(uint64_t);

  // `buffers`: kBufferBytes, 128-byte aligned; `barriers`: kStages words.
  __device__ BulkStoreRing(char* buffers, uint64_t* barriers) : buffers_(buffers), barriers_(barriers) {}

  // Before the first load: the barriers, and the order of the caller's
  // earlier generic accesses (inputs written in stream order) before the
  // bulk reads.
  __device__ void init() {
    for (int s = 0; s < kStages; ++s) barrier_init(barriers_ + s);
    barrier_init_fence();
    fence_global_before_bulk_copies();
  }

  // Reads `bytes` (a multiple of 16, at most kStageBytes, `src` 16-byte
  // aligned) of chunk n into its buffer.  Chunks are loaded in order; chunk n
  // may be loaded once end_stores() of chunk n - kStages + 1 has returned.
  __device__ void load(uint32_t n, const void* src, uint32_t bytes) {
    bulk_copy_to_shared(buffer(n), src, bytes, barriers_ + n % kStages);
  }

  // Waits (at most timeout_ns) until chunk n is in its buffer.
  __device__ bool wait_loaded(uint32_t n, int64_t timeout_ns) {
    return barrier_wait(barriers_ + n % kStages, (n / kStages) & 1u, timeout_ns);
  }

  // Writes the first `bytes` of chunk n's buffer to `dst` (16-byte aligned).
  __device__ void store(uint32_t n, void* dst, uint32_t bytes) { bulk_copy_to_global(dst, buffer(n), bytes); }

  // After the stores of a chunk: closes their group, then waits until the
  // previous chunk's stores have read their buffer (the one the next load
  // refills).  The stores of this chunk stay in flight.
  __device__ void end_stores() {
    bulk_commit_group();
    bulk_wait_groups_read<1>();
  }

  // Every store complete and ordered before this thread's later accesses.
  __device__ void wait_all_written() { bulk_wait_all_written(); }

  // Waits (bounded) for the loads issued but never stored: a block may not
  // leave while a copy still writes its shared memory.
  __device__ void drain_loads(uint32_t loaded, uint32_t stored, int64_t timeout_ns) {
    for (uint32_t n = stored; n < loaded; ++n) wait_loaded(n, timeout_ns);
  }

 private:
  __device__ char* buffer(uint32_t n) const { return buffers_ + static_cast<size_t>(n % kStages) * kStageBytes; }

  char* buffers_;
  uint64_t* barriers_;
};
#endif

}  // namespace kernels
}  // namespace moe_ep
