#include "host_gate.cuh"

namespace moe_ep_probe {

namespace {

// One thread: waits until the opened generation reaches `generation` (polled
// from host memory, a sleep between polls: the wait is never timed), or
// gives up after timeout_ns and records that.
__global__ void host_gate_kernel(unsigned* words, unsigned generation, unsigned long long timeout_ns) {
  const uint64_t start = global_ns();
  while (static_cast<int>(load_acquire_sys(words) - generation) < 0) {
    if (global_ns() - start > timeout_ns) {
      store_relaxed_sys(words + 1, 1);
      return;
    }
    __nanosleep(200);
  }
}

}  // namespace

HostGate::HostGate() {
  void* p = nullptr;
  PROBE_CUDA(cudaHostAlloc(&p, 2 * sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable));
  words_ = static_cast<unsigned*>(p);
  words_[0] = 0;
  words_[1] = 0;
}

HostGate::~HostGate() { cudaFreeHost(words_); }

void HostGate::hold(const Stream& stream, unsigned long long timeout_ns) {
  DeviceScope scope(stream.device());
  void* device_words = nullptr;  // the host address under unified addressing, but ask
  PROBE_CUDA(cudaHostGetDevicePointer(&device_words, words_, 0));
  launch(host_gate_kernel, 1, 1, stream.get(), false, static_cast<unsigned*>(device_words), next_generation_,
         timeout_ns);
}

void HostGate::open() { __atomic_store_n(words_, next_generation_++, __ATOMIC_SEQ_CST); }

bool HostGate::take_expired() { return __atomic_exchange_n(words_ + 1, 0u, __ATOMIC_SEQ_CST) != 0; }

}  // namespace moe_ep_probe
