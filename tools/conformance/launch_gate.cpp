#include "launch_gate.hpp"

#include "cuda_check.hpp"

namespace moe_ep_tool {

LaunchGate::LaunchGate() {
  void* p = nullptr;
  TOOL_CHECK_CUDA(cudaHostAlloc(&p, 2 * sizeof(int), cudaHostAllocMapped));
  flag_ = static_cast<volatile int*>(p);
  expired_ = flag_ + 1;
  flag_[0] = 0;
  expired_[0] = 0;
}

LaunchGate::~LaunchGate() { cudaFreeHost(const_cast<int*>(flag_)); }

void LaunchGate::close(cudaStream_t stream, double timeout_ms) {
  *flag_ = 0;
  *expired_ = 0;
  void* device_flag = nullptr;  // with unified addressing the host address works, but ask
  TOOL_CHECK_CUDA(cudaHostGetDevicePointer(&device_flag, const_cast<int*>(flag_), 0));
  auto* d = static_cast<volatile int*>(device_flag);
  launch_gate_kernel(stream, d, d + 1, static_cast<unsigned long long>(timeout_ms * 1e6));
}

void LaunchGate::open() {
  __atomic_store_n(const_cast<int*>(flag_), 1, __ATOMIC_SEQ_CST);
}

bool LaunchGate::expired() const { return *expired_ != 0; }

}  // namespace moe_ep_tool
