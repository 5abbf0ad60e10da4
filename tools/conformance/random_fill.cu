#include <cuda_bf16.h>

#include "random_fill.hpp"

namespace moe_ep_tool {

namespace {

__device__ inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_uniform_bf16(__nv_bfloat16* data, uint64_t count, uint64_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < count; i += uint64_t(gridDim.x) * blockDim.x) {
    const float unit = float(mix(seed ^ mix(i)) >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = __float2bfloat16_rn(2.0f * unit - 1.0f);
  }
}

}  // namespace

cudaError_t launch_fill_uniform_bf16(void* data, uint64_t count, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  fill_uniform_bf16<<<1024, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(data), count, seed);
  return cudaGetLastError();
}

}  // namespace moe_ep_tool
