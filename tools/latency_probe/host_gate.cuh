// HostGate: holds the streams of one or more GPUs behind one-thread kernels
// that wait for a word in pinned host memory, so that the host can queue a
// whole batch of timed calls on every stream and then release them all at
// once (as the moe_ep benchmark's launch gate does for its ranks).  Every
// gate gives up by itself after its timeout and says so: it can never hang a
// stream.
#pragma once

#include <cuda_runtime.h>

#include "cuda_support.cuh"

namespace moe_ep_probe {

class HostGate {
 public:
  HostGate();  // the words in pinned, mapped host memory, visible to every GPU
  ~HostGate();
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  // Queues on `stream` a gate that waits for the next open(), at most timeout_ns.
  void hold(const Stream& stream, unsigned long long timeout_ns);
  // Releases every gate queued since the last open().
  void open();
  // Whether a gate gave up before its open() since the last call (read only
  // after the gated streams have synchronized); clears the record.
  bool take_expired();

 private:
  unsigned* words_ = nullptr;  // [0]: the last generation opened; [1]: a gate expired
  unsigned next_generation_ = 1;
};

}  // namespace moe_ep_probe
