// A kernel that holds a stream until the host releases it (or a bound
// passes): device work that the tests control, e.g. unrelated work in flight
// while a handle is destroyed, or a rank stuck mid-dispatch in the kill probe.
// (Benchmark launch gating is moe_ep_conformance's LaunchGate.)
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
