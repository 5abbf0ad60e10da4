// The kernel behind LaunchGate: one thread spins on a mapped host flag, with a
// deadline read from %globaltimer so that it can never hang the stream.
#include <cuda_runtime.h>

#include "cuda_check.hpp"
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

void launch_gate_kernel(cudaStream_t stream, volatile int* flag, volatile int* expired,
                        unsigned long long timeout_ns) {
  gate_kernel<<<1, 1, 0, stream>>>(flag, expired, timeout_ns);
  TOOL_CHECK_CUDA(cudaGetLastError());
}

}  // namespace moe_ep_tool
