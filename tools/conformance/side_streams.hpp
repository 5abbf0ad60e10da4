// Streams beside the session stream for work that overlaps (bench
// --overlap-gemm, --micro-batch-overlap, --no-sm-held): a communication
// stream of the greatest priority and a compute stream of the least, as a
// server gives its all-to-all and its GEMMs, and the events that order them.
// On the host backend there are no streams: every stream is NULL and
// follow() does nothing (the calls there are synchronous).
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "session.hpp"

namespace moe_ep_tool {

class SideStreams {
 public:
  explicit SideStreams(const Session& s);
  ~SideStreams();
  SideStreams(const SideStreams&) = delete;
  SideStreams& operator=(const SideStreams&) = delete;

  void* comm() const { return comm_; }
  void* compute() const { return compute_; }
  // `waiter` waits for the work queued on `leader` so far (an event of a
  // ring, recorded now); capturable, so it forks and joins a captured graph.
  void follow(void* waiter, void* leader);

 private:
  cudaStream_t comm_ = nullptr, compute_ = nullptr;
  std::vector<cudaEvent_t> events_;
  size_t next_ = 0;
};

}  // namespace moe_ep_tool
