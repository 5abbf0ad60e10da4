#include "gpu/own_work.hpp"

#include "common/cuda_check.hpp"

namespace moe_ep {

OwnWork::OwnWork() {
  check_cuda(cudaEventCreateWithFlags(&eager_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  const cudaError_t rc = cudaEventCreateWithFlags(&replay_, cudaEventDisableTiming);
  if (rc != cudaSuccess) {
    cudaEventDestroy(eager_);
    check_cuda(rc, "cudaEventCreateWithFlags");
  }
}

OwnWork::~OwnWork() {
  // Destroying an event that is still pending is allowed: its resources go
  // once the work completes.  Nothing waits here.
  cudaEventDestroy(eager_);
  cudaEventDestroy(replay_);
}

void OwnWork::note(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) {
    check_cuda(cudaEventRecordWithFlags(replay_, stream, cudaEventRecordExternal),
               "cudaEventRecordWithFlags(cudaEventRecordExternal) in a CUDA graph capture");
    captured_ = true;
    return;
  }
  check_cuda(cudaEventRecord(eager_, stream), "cudaEventRecord");
}

cudaError_t OwnWork::query() const noexcept {
  const cudaError_t rc = cudaEventQuery(eager_);
  if (rc != cudaSuccess || !captured_) return rc;
  return cudaEventQuery(replay_);
}

cudaError_t OwnWork::synchronize() const noexcept {
  cudaError_t rc = cudaEventSynchronize(eager_);
  if (rc == cudaSuccess && captured_) {
    rc = cudaEventSynchronize(replay_);
    if (rc == cudaErrorCapturedEvent) {  // a driver that keeps the external record captured: the old, safe way
      cudaGetLastError();
      rc = cudaDeviceSynchronize();
    }
  }
  return rc;
}

}  // namespace moe_ep
