// Holds a stream's work behind a kernel that waits on a host flag, so that the
// host can queue a whole batch of timed iterations before the GPU starts:
// event-to-event times are then GPU times, not host launch gaps.  The wait is
// bounded: if the host could not queue the batch (a call that waits for the
// GPU on the host, or a full launch queue), the gate opens by itself and says
// so.
#pragma once

#include <cuda_runtime_api.h>

namespace moe_ep_tool {

class LaunchGate {
 public:
  LaunchGate();
  ~LaunchGate();
  LaunchGate(const LaunchGate&) = delete;
  LaunchGate& operator=(const LaunchGate&) = delete;

  void close(cudaStream_t stream, double timeout_ms);  // queue the waiting kernel
  void open();                                          // let it go
  bool expired() const;                                 // it opened by itself (read after a sync)

 private:
  volatile int* flag_ = nullptr;     // mapped host memory, written by the host
  volatile int* expired_ = nullptr;  // mapped host memory, written by the kernel
};

}  // namespace moe_ep_tool
