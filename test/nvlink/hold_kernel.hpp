// Holds a stream until *release (host-mapped memory) becomes non-zero or
// max_ns have passed.
#pragma once

#include <cuda_runtime_api.h>

namespace moe_ep_test {

cudaError_t launch_hold(cudaStream_t stream, const int* release_device, long long max_ns);

}  // namespace moe_ep_test
