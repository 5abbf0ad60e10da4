// Device helpers of the FP8 wire's kernels (wire_kernels.h): the e4m3fn
// conversions and the block scale, bit for bit those of src/wire_format.cpp,
// and the warps' walk over the segments of the rows of a WireRowSet.
//
// Every lane of a warp holds 8 consecutive elements of a 256-element chunk
// of a row: lanes 0-15 one 128-element block, lanes 16-31 the next, so a
// block's amax is a reduction over a half warp and no element of a lane
// crosses a block.  A warp's unit of work is a segment of a row, a few
// chunks whose loads are all issued before the first one is used: a row
// split into segments spreads a few rows over every warp of the grid, and
// the loads in flight per warp cover HBM's latency.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "common/host_device.h"
#include "moe_ep_kernels.h"
#include "wire_kernels.h"

// The wire's rounding needs IEEE division and subnormal fp32 values
// (scales down to 2^-149, quotients in e4m3's subnormal range).
#if defined(__CUDA_FTZ) && __CUDA_FTZ
#error "the FP8 wire kernels need -ftz=false"
#endif
#if defined(__CUDA_PREC_DIV) && !__CUDA_PREC_DIV
#error "the FP8 wire kernels need -prec-div=true"
#endif

namespace moe_ep {
namespace kernels {
namespace wire {

// One block per SM the launch may use (max_blocks), so the block is large:
// its warps are what keeps enough loads in flight on each SM.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kLaneElems = 8;
constexpr int kChunkElems = 32 * kLaneElems;
constexpr int kSegmentChunks = 4;
constexpr int kSegmentElems = kSegmentChunks * kChunkElems;
constexpr uint32_t kE4m3MaxBits = 0x43E00000u;  // 448.0f
constexpr uint8_t kE4m3NaN = 0x7F;

// fp32 to e4m3fn: round to nearest even, saturated to +-448 (Inf included),
// NaN to 0x7F (src/wire_format.cpp's float_to_e4m3).
__device__ __forceinline__ uint32_t float_to_e4m3(float value) {
  const uint32_t u = __float_as_uint(value);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kE4m3NaN;
  if (a >= kE4m3MaxBits) return sign | 0x7Eu;
  if (a < 0x3C800000u) {  // below 2^-6: a multiple of 2^-9, |value| * 2^9 is exact
    return sign | static_cast<uint32_t>(rintf(__fmul_rn(__uint_as_float(a), 512.0f)));
  }
  const uint32_t rounded = (a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;  // biased exponent << 3 | 3 mantissa bits
  return sign | min(rounded - (120u << 3), 0x7Eu);
}

// Two fp32 values to their codes (lo in the low byte), as float_to_e4m3: the
// hardware conversion rounds to nearest even and saturates to +-448, Inf
// included; a NaN is made the positive NaN first, since the host's NaN code
// has no sign.
__device__ __forceinline__ uint32_t floats_to_e4m3x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const float nan = __uint_as_float(0x7FC00000u);
  lo = lo == lo ? lo : nan;
  hi = hi == hi ? hi : nan;
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return float_to_e4m3(lo) | float_to_e4m3(hi) << 8;
#endif
}

// The value of a code; 0x7F and 0xFF give the quiet NaN with the code's sign.
__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  const uint32_t exp = (code >> 3) & 0xFu, man = code & 7u, sign = (code & 0x80u) << 24;
  if ((code & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u | sign);
  const uint32_t mag = exp == 0 ? __float_as_uint(__fmul_rn(static_cast<float>(man), 1.0f / 512.0f))
                                : ((exp + 120u) << 23) | (man << 20);
  return __uint_as_float(mag | sign);
}

// The fp32 value of a code in a block of `scale`: one multiplication rounded
// to nearest even.  A NaN code does not go through the multiplication: the
// hardware would return its one canonical NaN where the host keeps the
// operand's quiet NaN.  The dequantize kernel and the NCCL combine's
// reduction of FP8 rows both use it.
__device__ __forceinline__ float dequantize_code(uint32_t code, float scale) {
  const float x = e4m3_to_float(code);
  return (code & 0x7Fu) == 0x7Fu ? x : __fmul_rn(x, scale);
}

// The fp32 values of the two codes of `pair` (the low byte's in lo) in a
// block of `scale`, as dequantize_code: the hardware widens e4m3 to fp16
// exactly, and a NaN code gives the host's quiet NaN with the code's sign.
__device__ __forceinline__ void dequantize_pair(uint32_t pair, float scale, float& lo, float& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(static_cast<uint16_t>(pair)));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&halves));
  lo = (pair & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FC00000u | (pair & 0x80u) << 24) : __fmul_rn(f.x, scale);
  hi = (pair & 0x7F00u) == 0x7F00u ? __uint_as_float(0x7FC00000u | (pair & 0x8000u) << 16) : __fmul_rn(f.y, scale);
#else
  lo = dequantize_code(pair & 0xFFu, scale);
  hi = dequantize_code((pair >> 8) & 0xFFu, scale);
#endif
}

// 2^e for e in [-149, 127], from the bits.
__device__ __forceinline__ float power_of_two(int32_t e) {
  return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

// The scale of a block whose largest finite magnitude is amax (wire_block_scale).
__device__ __forceinline__ float block_scale(float amax, int32_t rule) {
  if (!(amax > 0.0f)) return 1.0f;
  if (rule == kWireScaleUe8m0) {
    // amax = 1.m * 2^k: the smallest e with 448 * 2^e >= amax is k - 8 when
    // 1.m <= 1.75, else k - 7.
    const uint32_t u = __float_as_uint(amax);
    int32_t k = static_cast<int32_t>(u >> 23) - 127;
    uint32_t man = u & 0x7FFFFFu;
    if ((u >> 23) == 0) {  // subnormal: shift the leading one to bit 23
      const int32_t shift = __clz(static_cast<int32_t>(man)) - 8;
      man = (man << shift) & 0x7FFFFFu;
      k = -126 - shift;
    }
    const int32_t e = man <= 0x600000u ? k - 8 : k - 7;
    return power_of_two(max(e, -127));
  }
  const float s = __fdiv_rn(amax, 448.0f);
  return s > 0.0f ? s : power_of_two(-149);
}

// Loads of 8 elements of a row as fp32 (exact), from a 16-byte vector or one
// by one (elements at or past `elems` read as 0).  A vector load is its
// kVectors raw 16-byte words, then `convert`, so that a caller may issue many
// loads before it converts any.
__device__ __forceinline__ uint4 load_nc(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

template <int kDtype>
struct Elements;

template <>
struct Elements<kCombineBf16> {
  static constexpr int kBytes = 2;
  static constexpr int kVectors = 1;
  static __device__ __forceinline__ void convert(const uint4* x, float (&v)[kLaneElems]) {
    const uint32_t w[4] = {x[0].x, x[0].y, x[0].z, x[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = __uint_as_float(w[k] << 16);
      v[2 * k + 1] = __uint_as_float(w[k] & 0xFFFF0000u);
    }
  }
  static __device__ __forceinline__ float load(const char* p) {
    return __uint_as_float(static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16);
  }
};

template <>
struct Elements<kCombineFp16> {
  static constexpr int kBytes = 2;
  static constexpr int kVectors = 1;
  static __device__ __forceinline__ void convert(const uint4* x, float (&v)[kLaneElems]) {
    const __half2* h = reinterpret_cast<const __half2*>(x);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(h[k]);
      v[2 * k] = f.x;
      v[2 * k + 1] = f.y;
    }
  }
  static __device__ __forceinline__ float load(const char* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
  }
};

template <>
struct Elements<kCombineFp32> {
  static constexpr int kBytes = 4;
  static constexpr int kVectors = 2;
  static __device__ __forceinline__ void convert(const uint4* x, float (&v)[kLaneElems]) {
    const uint4 a = x[0], b = x[1];
    v[0] = __uint_as_float(a.x), v[1] = __uint_as_float(a.y), v[2] = __uint_as_float(a.z), v[3] = __uint_as_float(a.w);
    v[4] = __uint_as_float(b.x), v[5] = __uint_as_float(b.y), v[6] = __uint_as_float(b.z), v[7] = __uint_as_float(b.w);
  }
  static __device__ __forceinline__ float load(const char* p) { return *reinterpret_cast<const float*>(p); }
};

template <class E>
__device__ __forceinline__ void load_vector(const char* p, float (&v)[kLaneElems]) {
  uint4 x[E::kVectors];
#pragma unroll
  for (int i = 0; i < E::kVectors; ++i) x[i] = load_nc(p + 16 * i);
  E::convert(x, v);
}

// The block's amax is taken over its finite elements: NaN and Inf left out.
__device__ __forceinline__ float finite_max(float amax, float x) {
  const float a = fabsf(x);
  return a <= 3.402823466e38f ? fmaxf(amax, a) : amax;
}

// 8 elements of a block of `scale` into their codes, two a word (the lower
// element in the lower byte).  FP32 scales: one division each, rounded to
// nearest even, as the host does (the scale's reciprocal is inexact, so a
// multiplication by it would round differently).  UE8M0 scales: a power of
// two from 2^-127 to 2^120, whose reciprocal is a float exactly, and x times
// it is the same real number as x / scale, rounded once to nearest even as
// the division is: the same codes.
__device__ __forceinline__ void encode_lane(const float (&v)[kLaneElems], float scale, int32_t rule,
                                            uint32_t (&pairs)[kLaneElems / 2]) {
  if (rule == kWireScaleUe8m0) {
    const float inverse = __fdiv_rn(1.0f, scale);
#pragma unroll
    for (int k = 0; k < kLaneElems / 2; ++k) {
      pairs[k] = floats_to_e4m3x2(__fmul_rn(v[2 * k], inverse), __fmul_rn(v[2 * k + 1], inverse));
    }
  } else {
#pragma unroll
    for (int k = 0; k < kLaneElems / 2; ++k) {
      pairs[k] = floats_to_e4m3x2(__fdiv_rn(v[2 * k], scale), __fdiv_rn(v[2 * k + 1], scale));
    }
  }
}

// Whether row `row` of the set is taken.
__device__ __forceinline__ bool row_taken(const WireRowSet& set, int64_t row) {
  if (set.counts == nullptr) return true;
  const int64_t source = row / set.per_source;
  return row - source * set.per_source < __ldg(set.counts + source);
}

// The rows the warps walk: every row of the set, taken or not.
MOE_EP_HOST_DEVICE int64_t set_rows(const WireRowSet& set) {
  return set.counts == nullptr ? set.rows : static_cast<int64_t>(set.sources) * set.per_source;
}

MOE_EP_HOST_DEVICE int64_t row_segments(int32_t elems) { return (elems + kSegmentElems - 1) / kSegmentElems; }

// Calls f(row, first element of the segment) for each segment of each taken
// row of the set, spread over the grid's warps.
template <class F>
__device__ __forceinline__ void for_each_segment(const WireRowSet& set, int32_t elems, F&& f) {
  const int64_t segments = row_segments(elems);
  const int64_t items = set_rows(set) * segments;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; item < items; item += warps) {
    const int64_t row = item / segments;
    if (!row_taken(set, row)) continue;
    f(row, static_cast<int32_t>((item - row * segments) * kSegmentElems));
  }
}

// Host side: the set's checks and the grid for it.
inline bool valid_row_set(const WireRowSet& set, int32_t elems) {
  const bool counts_ok = set.counts == nullptr ? set.rows >= 0 : set.sources >= 0 && set.per_source >= 0;
  // The grid walks rows x segments items in int64.
  return counts_ok && elems >= 1 && set_rows(set) <= INT64_MAX / row_segments(elems);
}
inline int wire_grid(const WireRowSet& set, int32_t elems, int32_t max_blocks) {
  int64_t blocks = (set_rows(set) * row_segments(elems) + kWarps - 1) / kWarps;
  if (blocks > max_blocks) blocks = max_blocks;
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

}  // namespace wire
}  // namespace kernels
}  // namespace moe_ep
