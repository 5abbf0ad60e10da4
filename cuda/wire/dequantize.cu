// FP8 wire rows back to bf16, fp16 or fp32 (wire_kernels.h): a warp per row,
// 8 codes a lane (one 8-byte load), each times its block's scale in one fp32
// multiplication rounded to nearest even, stored with 16-byte stores.  A NaN
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

template <int kDtype>
__device__ __forceinline__ void dequantize_row(const DequantizeParams& p, const uint8_t* codes, const float* scales,
                                               char* dst, int lane) {
  using S = Stores<kDtype>;
  const int32_t n = p.d.elems;
  const bool vectors = p.vectors != 0;
#pragma unroll 2
  for (int32_t first = lane * kLaneElems; first < n; first += kChunkElems) {
    const float scale = __ldg(scales + first / kWireBlockElems);
    uint32_t c[kLaneElems];
    if (vectors) {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(codes + first));
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        c[k] = (x.x >> (8 * k)) & 0xFFu;
        c[k + 4] = (x.y >> (8 * k)) & 0xFFu;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) c[k] = first + k < n ? __ldg(codes + first + k) : 0u;
    }
    float v[kLaneElems];
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) v[k] = dequantize_code(c[k], scale);
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
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const DequantizeParams p) {
  wait_for_prior_grid();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  const int64_t rows = set_rows(p.set);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    if (!row_taken(p.set, row)) continue;
    dequantize_row<kDtype>(
        p, p.d.codes + row * p.d.codes_stride,
        reinterpret_cast<const float*>(reinterpret_cast<const char*>(p.d.scales) + row * p.d.scales_stride),
        static_cast<char*>(p.d.out) + row * p.d.out_stride, lane);
  }
}

}  // namespace
}  // namespace wire

cudaError_t launch_dequantize_rows(const WireDequantizeRows& d, const WireRowSet& rows, int32_t max_blocks,
                                   int32_t pdl, cudaStream_t stream) {
  const int bytes = d.dtype == kCombineFp32 ? 4 : 2;
  const bool dtype_ok = d.dtype == kCombineBf16 || d.dtype == kCombineFp16 || d.dtype == kCombineFp32;
  if (!dtype_ok || d.elems < 1 || !wire::valid_row_set(rows) || max_blocks < 1 ||
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
  const int blocks = wire::wire_grid(rows, max_blocks);
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
