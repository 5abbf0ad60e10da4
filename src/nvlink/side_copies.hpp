// Copies on a side stream of the handle, in chunks that the caller's stream
// waits for one at a time: the copy engines move chunk k + 1 while kernels on
// the caller's stream work on chunk k.  Fork and joins are event records and
// waits, so the whole pattern is captured into a CUDA graph like any stream
// work, and the caller's stream has waited for every copy once the last chunk
// is joined (nothing is left behind on the side stream).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace moe_ep {

class SideCopies {
 public:
  static constexpr int kMaxChunks = 16;

  // Creates the side stream and the events on the current device.  Throws
  // CUDA_ERROR.
  SideCopies();
  ~SideCopies();
  SideCopies(const SideCopies&) = delete;
  SideCopies& operator=(const SideCopies&) = delete;

  // The side stream waits for everything issued on `stream` so far.
  void fork(cudaStream_t stream);
  // A device-to-device copy on the side stream.
  void copy(void* dst, const void* src, size_t bytes);
  // `stream` waits for every copy issued since the fork (chunk 0 .. chunk).
  void join(int chunk, cudaStream_t stream);

 private:
  void release() noexcept;

  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t chunks_[kMaxChunks] = {};
};

}  // namespace moe_ep
