// The last work a handle put on a caller's stream, eager or replayed from a
// CUDA graph, so that waiting for "the handle's work" waits for that and
// nothing else on the device (never cudaDeviceSynchronize: other libraries'
// kernels are not ours to wait for).  Used by both GPU backends.
//
// An eager call records an event after its last kernel.  A captured call
// records a second event as an external event-record node inside the graph,
// which every replay records again when the replayed kernels are done.
#pragma once

#include <cuda_runtime_api.h>

namespace moe_ep {

class OwnWork {
 public:
  OwnWork();  // creates the two events on the current device; throws CUDA_ERROR
  ~OwnWork();
  OwnWork(const OwnWork&) = delete;
  OwnWork& operator=(const OwnWork&) = delete;

  // After a call's last launch on `stream` (capturing or not).  Throws CUDA_ERROR.
  void note(cudaStream_t stream);
  // cudaSuccess once everything noted has finished, cudaErrorNotReady while it
  // runs, another error if the device reported one.  Never blocks.
  cudaError_t query() const noexcept;
  // Blocks until everything noted has finished; its error, if any.
  cudaError_t synchronize() const noexcept;

 private:
  cudaEvent_t eager_ = nullptr;   // after the last eager call
  cudaEvent_t replay_ = nullptr;  // after the last replay of a captured call
  bool captured_ = false;         // some call was captured into a graph
};

}  // namespace moe_ep
