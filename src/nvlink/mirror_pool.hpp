// Host-mapped slots for the timeout mirror of NVLink handles, from a
// process-wide pool that is never freed.  Why: freeing pinned host memory
// (cudaFreeHost) makes the driver wait for the whole device, so a destroy that
// freed its mirror would wait for every other library's kernels; returning a
// slot to the pool waits for nothing.  The pool keeps one page per 64 handles
// that were alive at the same time, for the life of the process.
#pragma once

#include "moe_ep_kernels.h"

namespace moe_ep {

struct MirrorSlot {
  kernels::HostTimeoutMirror* host = nullptr;    // what the host reads
  kernels::HostTimeoutMirror* device = nullptr;  // what the kernels write (mapped)
};

// A free slot, zeroed (no timeout recorded), mapped for the current device.
// Throws CUDA_ERROR / OUT_OF_MEMORY when a new page cannot be allocated.
MirrorSlot acquire_mirror_slot();

// Returns a slot to the pool; the handle's kernels must have finished.  NULL
// is a no-op.  Never fails, never waits.
void release_mirror_slot(kernels::HostTimeoutMirror* host) noexcept;

}  // namespace moe_ep
