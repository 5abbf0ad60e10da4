// A kernel that holds a stream until the host releases it (or a bound
// passes), so that a timing loop can queue all its work first and the GPU then
// runs it back to back: event timings then measure the GPU, not the host's
// launch rate.
#include "hold_kernel.hpp"

namespace moe_ep_test {

namespace {
__global__ void hold_kernel(const volatile int* release, long long max_ns) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (*release == 0 && now - start < max_ns);
}
}  // namespace

cudaError_t launch_hold(cudaStream_t stream, const int* release_device, long long max_ns) {
  hold_kernel<<<1, 1, 0, stream>>>(release_device, max_ns);
  return cudaGetLastError();
}

}  // namespace moe_ep_test
