#include "nvlink/side_copies.hpp"

#include "error.hpp"
#include "nvlink/cuda_check.hpp"

namespace moe_ep {

SideCopies::SideCopies() {
  try {
    check_cuda(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "creating the copy stream");
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "creating the copy events");
    for (cudaEvent_t& e : chunks_) {
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "creating the copy events");
    }
  } catch (...) {
    release();
    throw;
  }
}

SideCopies::~SideCopies() { release(); }

void SideCopies::release() noexcept {
  for (cudaEvent_t e : chunks_) {
    if (e) cudaEventDestroy(e);
  }
  if (fork_) cudaEventDestroy(fork_);
  if (side_) cudaStreamDestroy(side_);
  for (cudaEvent_t& e : chunks_) e = nullptr;
  fork_ = nullptr;
  side_ = nullptr;
}

void SideCopies::fork(cudaStream_t stream) {
  check_cuda(cudaEventRecord(fork_, stream), "forking the copy stream");
  check_cuda(cudaStreamWaitEvent(side_, fork_, 0), "forking the copy stream");
}

void SideCopies::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, side_), "copying a peer's rows");
}

void SideCopies::join(int chunk, cudaStream_t stream) {
  if (chunk < 0 || chunk >= kMaxChunks) fail(MOE_EP_ERROR_INTERNAL, "SideCopies::join: chunk ", chunk);
  check_cuda(cudaEventRecord(chunks_[chunk], side_), "joining the copy stream");
  check_cuda(cudaStreamWaitEvent(stream, chunks_[chunk], 0), "joining the copy stream");
}

}  // namespace moe_ep
