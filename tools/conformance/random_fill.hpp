// Device memory filled with uniform random bf16 values in [-1, 1), on the
// GPU (a counter hash of seed and index, no host copy): the operands of the
// overlap's GEMM, random so that it draws the power a real one does.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace moe_ep_tool {

cudaError_t launch_fill_uniform_bf16(void* data, uint64_t count, uint64_t seed, cudaStream_t stream);

}  // namespace moe_ep_tool
