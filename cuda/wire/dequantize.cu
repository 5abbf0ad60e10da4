// FP8 wire rows back to bf16, fp16 or fp32 (wire_kernels.h): a warp per
// segment of a row, 8 codes a lane (one 8-byte load), each times its block's
// scale in one fp32 multiplication rounded to nearest even, stored with
// 16-byte stores.  A NaN
// code does not go through the multiplication: the hardware would return its
// one canonical NaN where the host keeps the operand's quiet NaN, so the
// kernel writes that NaN itself.
#include <stdint.h>

#include "common/float_convert.cuh"
#include "common/kernel_launch.cuh"
#include "wire/wire_rows.cuh"

namespace moe_ep {
namespace kernels {
namespace wire {
namespace {

struct DequantizeParams {
  WireDequantizeRows d;
  WireRowSet set;
  int32_t vectors;  // nonzero: 8-byte code loads and 16-byte stores
};

template <int kDtype>
struct Stores;

template <>
struct Stores<kCombineBf16> {
  static constexpr int kBytes = 2;
  static __device__ __forceinline__ void store_vector(char* p, const float (&v)[kLaneElems]) {
    *reinterpret_cast<uint4*>(p) = floats_to_x8_bits<Bf16Bits>(v);
  }
  static __device__ __forceinline__ void store(char* p, float f) {
    *reinterpret_cast<uint16_t*>(p) = float_to_bf16_bits(f);
  }
};

template <>
struct Stores<kCombineFp16> {
  static constexpr int kBytes = 2;
  static __device__ __forceinline__ void store_vector(char* p, const float (&v)[kLaneElems]) {
    *reinterpret_cast<uint4*>(p) = floats_to_x8_bits<Fp16Bits>(v);
  }
  static __device__ __forceinline__ void store(char* p, float f) {
    *reinterpret_cast<uint16_t*>(p) = float_to_fp16_bits(f);
  }
};

template <>
struct Stores<kCombineFp32> {
  static constexpr int kBytes = 4;
  static __device__ __forceinline__ void store_vector(char* p, const float (&v)[kLaneElems]) {
    uint4* q = reinterpret_cast<uint4*>(p);
    q[0] = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    q[1] = make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]), __float_as_uint(v[7]));
  }
  static __device__ __forceinline__ void store(char* p, float f) { *reinterpret_cast<float*>(p) = f; }
};

// The lane's 8 codes from element `first` on, two per pair (0 past the row).
__device__ __forceinline__ void load_codes(const uint8_t* codes, int32_t first, int32_t n, bool vectors,
                                           uint32_t (&pairs)[kLaneElems / 2]) {
  if (vectors) {
    const uint2 x = first < n ? __ldg(reinterpret_cast<const uint2*>(codes + first)) : make_uint2(0u, 0u);
    pairs[0] = x.x & 0xFFFFu, pairs[1] = x.x >> 16, pairs[2] = x.y & 0xFFFFu, pairs[3] = x.y >> 16;
  } else {
#pragma unroll
    for (int k = 0; k < kLaneElems / 2; ++k) {
      const uint32_t lo = first + 2 * k < n ? __ldg(codes + first + 2 * k) : 0u;
      const uint32_t hi = first + 2 * k + 1 < n ? __ldg(codes + first + 2 * k + 1) : 0u;
      pairs[k] = lo | hi << 8;
    }
  }
}

// A segment of a row: every chunk's codes and scales loaded first, then each
// chunk's products and stores.
template <int kDtype>
__device__ __forceinline__ void dequantize_segment(const DequantizeParams& p, const uint8_t* codes,
                                                   const float* scales, char* dst, int32_t start, int lane) {
  using S = Stores<kDtype>;
  const int32_t n = p.d.elems;
  const bool vectors = p.vectors != 0;
  uint32_t c[kSegmentChunks][kLaneElems / 2];
  float scale[kSegmentChunks];
#pragma unroll
  for (int i = 0; i < kSegmentChunks; ++i) {
    const int32_t first = start + i * kChunkElems + lane * kLaneElems;
    load_codes(codes, first, n, vectors, c[i]);
    scale[i] = first < n ? __ldg(scales + first / kWireBlockElems) : 1.0f;
  }
#pragma unroll
  for (int i = 0; i < kSegmentChunks; ++i) {
    const int32_t first = start + i * kChunkElems + lane * kLaneElems;
    if (first >= n) break;
    float v[kLaneElems];
#pragma unroll
    for (int k = 0; k < kLaneElems / 2; ++k) {
      dequantize_pair(c[i][k], scale[i], v[2 * k], v[2 * k + 1]);
    }
    if (vectors) {
      S::store_vector(dst + static_cast<int64_t>(first) * S::kBytes, v);
    } else {
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) {
        if (first + k < n) S::store(dst + static_cast<int64_t>(first + k) * S::kBytes, v[k]);
      }
    }
  }
}

template <int kDtype>
__global__ void __launch_bounds__(kThreads, 1) dequantize_kernel(const DequantizeParams p) {
  wait_for_prior_grid();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  for_each_segment(p.set, p.d.elems, [&](int64_t row, int32_t start) {
    dequantize_segment<kDtype>(
        p, p.d.codes + row * p.d.codes_stride,
        reinterpret_cast<const float*>(reinterpret_cast<const char*>(p.d.scales) + row * p.d.scales_stride),
        static_cast<char*>(p.d.out) + row * p.d.out_stride, start, lane);
  });
}

}  // namespace
}  // namespace wire

cudaError_t launch_dequantize_rows(const WireDequantizeRows& d, const WireRowSet& rows, int32_t max_blocks,
                                   int32_t pdl, cudaStream_t stream) {
  const int bytes = d.dtype == kCombineFp32 ? 4 : 2;
  const bool dtype_ok = d.dtype == kCombineBf16 || d.dtype == kCombineFp16 || d.dtype == kCombineFp32;
  if (!dtype_ok || d.elems < 1 || !wire::valid_row_set(rows, d.elems) || max_blocks < 1 ||
      d.out_stride < int64_t{d.elems} * bytes || reinterpret_cast<uintptr_t>(d.out) % bytes != 0 ||
      d.out_stride % bytes != 0 || d.codes_stride < d.elems ||
      d.scales_stride < int64_t{wire_row_blocks(d.elems)} * 4 || reinterpret_cast<uintptr_t>(d.scales) % 4 != 0 ||
      d.scales_stride % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  if (wire::set_rows(rows) == 0) return cudaSuccess;
  const bool vectors = d.elems % wire::kLaneElems == 0 && reinterpret_cast<uintptr_t>(d.codes) % 8 == 0 &&
                       d.codes_stride % 8 == 0 && reinterpret_cast<uintptr_t>(d.out) % 16 == 0 &&
                       d.out_stride % 16 == 0;
  const wire::DequantizeParams p{d, rows, vectors ? 1 : 0};
  const int blocks = wire::wire_grid(rows, d.elems, max_blocks);
  switch (d.dtype) {
    case kCombineBf16:
      return launch_kernel(wire::dequantize_kernel<kCombineBf16>, blocks, wire::kThreads, 0, stream, pdl, p);
    case kCombineFp16:
      return launch_kernel(wire::dequantize_kernel<kCombineFp16>, blocks, wire::kThreads, 0, stream, pdl, p);
    default: return launch_kernel(wire::dequantize_kernel<kCombineFp32>, blocks, wire::kThreads, 0, stream, pdl, p);
  }
}

}  // namespace kernels
}  // namespace moe_ep
