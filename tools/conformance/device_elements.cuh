// The tool's CUDA kernels' element helpers: bf16, fp16 and fp32 to and from
// fp32 (round to nearest even), and runs of consecutive elements that load as
// one access.  Device code, included by the tool's .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace moe_ep_tool {
namespace device_elements {

__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(float x) { return x; }
template <typename T>
__device__ inline T from_float(float x);
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ inline __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ inline float from_float<float>(float x) {
  return x;
}

// kRun consecutive elements, aligned so that they load as one access (or a
// few 16-byte ones).
template <typename T, int kRun>
struct alignas(sizeof(T) * kRun) Run {
  T v[kRun];
};

}  // namespace device_elements
}  // namespace moe_ep_tool
