// bf16/fp16 <-> fp32 conversions for combine, bit-identical to the host ones
// in src/dtype.cpp (round to nearest even; NaN kept quiet with its sign), so
// that GPU combine results equal the HOST backend's bit for bit.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

namespace moe_ep {
namespace kernels {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float value) {
  const uint32_t u = __float_as_uint(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

__device__ __forceinline__ float fp16_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ uint16_t float_to_fp16_bits(float value) {
  const uint32_t u = __float_as_uint(value);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7E00u);
  return __half_as_ushort(__float2half_rn(value));
}

// One element type of combine: how it loads to and stores from fp32.
struct Bf16Element {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits b) { return bf16_bits_to_float(b); }
  static __device__ __forceinline__ Bits store(float f) { return float_to_bf16_bits(f); }
};
struct Fp16Element {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits b) { return fp16_bits_to_float(b); }
  static __device__ __forceinline__ Bits store(float f) { return float_to_fp16_bits(f); }
};
struct Fp32Element {
  using Bits = uint32_t;
  static __device__ __forceinline__ float load(Bits b) { return __uint_as_float(b); }
  static __device__ __forceinline__ Bits store(float f) { return __float_as_uint(f); }
};

}  // namespace kernels
}  // namespace moe_ep
