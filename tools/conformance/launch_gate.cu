// LaunchGate: the host side, and the kernel that one thread runs, spinning on
// a mapped host flag with a deadline read from %globaltimer so that it can
// never hang the stream.
#include <cuda_runtime.h>

#include "errors.hpp"
#include "launch_gate.hpp"

namespace moe_ep_tool {

namespace {
__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void gate_kernel(volatile int* flag, volatile int* expired, unsigned long long timeout_ns) {
  const unsigned long long start = global_ns();
  while (*flag == 0) {
    if (global_ns() - start > timeout_ns) {
      *expired = 1;
      return;
    }
    __nanosleep(500);
  }
}
}  // namespace

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
  gate_kernel<<<1, 1, 0, stream>>>(d, d + 1, static_cast<unsigned long long>(timeout_ms * 1e6));
  TOOL_CHECK_CUDA(cudaGetLastError());
}

void LaunchGate::open() {
  __atomic_store_n(const_cast<int*>(flag_), 1, __ATOMIC_SEQ_CST);
}

bool LaunchGate::expired() const { return *expired_ != 0; }

}  // namespace moe_ep_tool
