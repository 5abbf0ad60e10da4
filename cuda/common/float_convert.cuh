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

// Two values at once, `lo` into the low 16 bits: one hardware conversion
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, round to nearest even, the same bits
// as the scalar functions above for every input that is not a NaN, checked
// over all 2^32 inputs by test/nvlink/test_float_convert.cu).  A NaN takes the
// scalar path, which keeps its sign and payload as the host does (the
// hardware returns one canonical NaN).  Why: combine's output stores are
// instruction-bound on few SMs, and the scalar rounding costs about seven
// instructions per value against half of one here.  scalar_pair is the
// scalar path for both values (NaNs, and devices without the instruction).
template <typename Format>
__device__ __forceinline__ uint32_t scalar_pair(float lo, float hi) {
  return static_cast<uint32_t>(Format::scalar(lo)) | (static_cast<uint32_t>(Format::scalar(hi)) << 16);
}
struct Bf16Bits {
  static __device__ __forceinline__ uint16_t scalar(float f) { return float_to_bf16_bits(f); }
  static __device__ __forceinline__ uint32_t hardware(float lo, float hi) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    uint32_t packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
#else
    return scalar_pair<Bf16Bits>(lo, hi);
#endif
  }
};
struct Fp16Bits {
  static __device__ __forceinline__ uint16_t scalar(float f) { return float_to_fp16_bits(f); }
  static __device__ __forceinline__ uint32_t hardware(float lo, float hi) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    uint32_t packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
#else
    return scalar_pair<Fp16Bits>(lo, hi);
#endif
  }
};

// True when lo or hi is a NaN (one unordered compare).
__device__ __forceinline__ bool either_nan(float lo, float hi) { return !(lo == lo && hi == hi); }

template <typename Format>
__device__ __forceinline__ uint32_t floats_to_x2_bits(float lo, float hi) {
  if (either_nan(lo, hi)) return scalar_pair<Format>(lo, hi);
  return Format::hardware(lo, hi);
}

// Eight values into four packed pairs, with one NaN test for the eight and
// no branch per pair (the pull's consumers are instruction-bound on few SMs,
// and a test, branch and reconvergence per pair is a large part of their work
// per row); the same bits as four floats_to_x2_bits.
template <typename Format>
__device__ __forceinline__ uint4 floats_to_x8_bits(const float (&v)[8]) {
  const bool nan = either_nan(v[0], v[1]) | either_nan(v[2], v[3]) | either_nan(v[4], v[5]) | either_nan(v[6], v[7]);
  if (nan) {
    return make_uint4(floats_to_x2_bits<Format>(v[0], v[1]), floats_to_x2_bits<Format>(v[2], v[3]),
                      floats_to_x2_bits<Format>(v[4], v[5]), floats_to_x2_bits<Format>(v[6], v[7]));
  }
  return make_uint4(Format::hardware(v[0], v[1]), Format::hardware(v[2], v[3]), Format::hardware(v[4], v[5]),
                    Format::hardware(v[6], v[7]));
}

__device__ __forceinline__ uint32_t floats_to_bf16x2_bits(float lo, float hi) {
  return floats_to_x2_bits<Bf16Bits>(lo, hi);
}
__device__ __forceinline__ uint32_t floats_to_fp16x2_bits(float lo, float hi) {
  return floats_to_x2_bits<Fp16Bits>(lo, hi);
}

// A token's two partial rows summed with packed adds: the result of
// 0 + a + b in fp32 (combine's order, the lower rank's a first), rounded once
// to the 16-bit format, is the exact sum a + b rounded once to that format:
// fp32 keeps 24 significand bits, at least 2p + 2 for bf16 (p = 8) and fp16
// (p = 11), and for such formats rounding to the wider one first is
// innocuous for a sum.  Adding +0 first turns a -0 into +0, as the fp32
// accumulator that starts at +0 does (-0 + -0 would stay -0).  NaN results
// (a NaN input, inf - inf) are flagged, not trusted: the hardware returns one
// canonical NaN where the host keeps the payload; the caller recomputes them
// in fp32.  test/nvlink/test_float_convert.cu checks every pair of 16-bit
// inputs, in both orders.  Why: on a few SMs the pull's consumers are
// instruction-bound, and this is 2 packed adds and a 3-instruction NaN test
// per two values where widening, fp32 adds and conversion took about 12.
__device__ __forceinline__ uint32_t bf16x2_add_rn(uint32_t a, uint32_t b) {
  uint32_t d;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
#elif !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(b));  // a * 1 + b
#else
  d = 0x7FFF7FFFu;  // no packed bf16 arithmetic: a NaN, so that the caller takes the fp32 path
  (void)a;
  (void)b;
#endif
  return d;
}
__device__ __forceinline__ uint32_t fp16x2_add_rn(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Nonzero where a half of `w` is a NaN: the half's magnitude plus
// (0x8000 - smallest NaN magnitude) reaches its sign bit exactly for NaN
// magnitudes, and never carries into the other half.
template <uint32_t kSmallestNanMagnitude>
__device__ __forceinline__ uint32_t nan_halves(uint32_t w) {
  constexpr uint32_t bias = 0x8000u - kSmallestNanMagnitude;
  return ((w & 0x7FFF7FFFu) + (bias | bias << 16)) & 0x80008000u;
}
template <uint32_t (*kAdd)(uint32_t, uint32_t), uint32_t kSmallestNanMagnitude>
__device__ __forceinline__ uint4 sum_two_x8(const uint4& a, const uint4& b, uint32_t& nan) {
  const uint4 r = make_uint4(kAdd(kAdd(a.x, 0u), b.x), kAdd(kAdd(a.y, 0u), b.y), kAdd(kAdd(a.z, 0u), b.z),
                             kAdd(kAdd(a.w, 0u), b.w));
  nan |= nan_halves<kSmallestNanMagnitude>(r.x) | nan_halves<kSmallestNanMagnitude>(r.y) |
         nan_halves<kSmallestNanMagnitude>(r.z) | nan_halves<kSmallestNanMagnitude>(r.w);
  return r;
}

// One element type of combine: how it loads to and stores from fp32, one
// value (load, store) or a 16-byte vector of them (add_vector: each value
// added to its accumulator, in order; store_vector).  16-bit formats also
// sum two partial vectors straight into output bits (sum_two, kSumsTwo).
struct Bf16Element {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits b) { return bf16_bits_to_float(b); }
  // A 32-bit word's two values widened with one instruction each (a shift,
  // a mask) where the 16-bit loads cost two for the high one.
  static __device__ __forceinline__ void add_vector(float (&acc)[8], const uint4& x) {
    const uint32_t w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc[2 * k] += __uint_as_float(w[k] << 16);
      acc[2 * k + 1] += __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
  static __device__ __forceinline__ Bits store(float f) { return float_to_bf16_bits(f); }
  static __device__ __forceinline__ uint4 store_vector(const float (&v)[8]) { return floats_to_x8_bits<Bf16Bits>(v); }
  static constexpr bool kSumsTwo = true;
  static __device__ __forceinline__ uint4 sum_two(const uint4& a, const uint4& b, uint32_t& nan) {
    return sum_two_x8<bf16x2_add_rn, 0x7F81u>(a, b, nan);
  }
};
struct Fp16Element {
  using Bits = uint16_t;
  static __device__ __forceinline__ float load(Bits b) { return fp16_bits_to_float(b); }
  static __device__ __forceinline__ void add_vector(float (&acc)[8], const uint4& x) {
    const Bits* b = reinterpret_cast<const Bits*>(&x);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += load(b[e]);
  }
  static __device__ __forceinline__ Bits store(float f) { return float_to_fp16_bits(f); }
  static __device__ __forceinline__ uint4 store_vector(const float (&v)[8]) { return floats_to_x8_bits<Fp16Bits>(v); }
  static constexpr bool kSumsTwo = true;
  static __device__ __forceinline__ uint4 sum_two(const uint4& a, const uint4& b, uint32_t& nan) {
    return sum_two_x8<fp16x2_add_rn, 0x7C01u>(a, b, nan);
  }
};
struct Fp32Element {
  using Bits = uint32_t;
  static constexpr bool kSumsTwo = false;  // fp32 partials: the fp32 adds are the sum
  static __device__ __forceinline__ float load(Bits b) { return __uint_as_float(b); }
  static __device__ __forceinline__ void add_vector(float (&acc)[4], const uint4& x) {
    acc[0] += __uint_as_float(x.x);
    acc[1] += __uint_as_float(x.y);
    acc[2] += __uint_as_float(x.z);
    acc[3] += __uint_as_float(x.w);
  }
  static __device__ __forceinline__ Bits store(float f) { return __float_as_uint(f); }
  static __device__ __forceinline__ uint4 store_vector(const float (&v)[4]) {
    return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
  }
};

}  // namespace kernels
}  // namespace moe_ep
