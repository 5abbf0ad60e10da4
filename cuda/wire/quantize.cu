// Rows into the FP8 wire (wire_kernels.h): a warp per row walks it in chunks
// of two 128-element blocks, 8 elements a lane; each half warp reduces its
// block's amax over finite values with four shuffles, derives the scale,
// divides (one fp32 division rounded to nearest even, as the host does, never
// a multiplication by a reciprocal: that rounds differently) and stores the
// 8 codes with one 8-byte store.
#include <stdint.h>

#include "common/kernel_launch.cuh"
#include "wire/wire_rows.cuh"

namespace moe_ep {
namespace kernels {
namespace wire {
namespace {

struct QuantizeParams {
  WireQuantizeRows q;
  WireRowSet set;
  int32_t vectors;  // nonzero: 16-byte loads and 8-byte code stores
};

__device__ __forceinline__ float finite_max(float amax, float x) {
  const float a = fabsf(x);
  return a <= 3.402823466e38f ? fmaxf(amax, a) : amax;  // NaN and Inf left out
}

template <int kDtype>
__device__ __forceinline__ void quantize_row(const QuantizeParams& p, const char* src, uint8_t* codes, float* scales,
                                             int lane) {
  using E = Elements<kDtype>;
  const int32_t n = p.q.elems;
  const bool vectors = p.vectors != 0;
#pragma unroll 2
  for (int32_t base = 0; base < n; base += kChunkElems) {
    const int32_t first = base + lane * kLaneElems;
    float v[kLaneElems];
    if (vectors && first < n) {
      E::load_vector(src + static_cast<int64_t>(first) * E::kBytes, v);
    } else {
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) {
        v[k] = first + k < n ? E::load(src + static_cast<int64_t>(first + k) * E::kBytes) : 0.0f;
      }
    }
    float amax = 0.0f;
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) amax = finite_max(amax, v[k]);
#pragma unroll
    for (int d = 8; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
    const float scale = block_scale(amax, p.q.scale_rule);
    const int32_t block_first = base + (lane & 16) * kLaneElems;
    if ((lane & 15) == 0 && block_first < n) scales[block_first / kWireBlockElems] = scale;
    uint32_t c[kLaneElems];
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) c[k] = float_to_e4m3(__fdiv_rn(v[k], scale));
    if (vectors && first < n) {
      *reinterpret_cast<uint2*>(codes + first) =
          make_uint2(c[0] | c[1] << 8 | c[2] << 16 | c[3] << 24, c[4] | c[5] << 8 | c[6] << 16 | c[7] << 24);
    } else {
#pragma unroll
      for (int k = 0; k < kLaneElems; ++k) {
        if (first + k < n) codes[first + k] = static_cast<uint8_t>(c[k]);
      }
    }
  }
}

template <int kDtype>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const QuantizeParams p) {
  wait_for_prior_grid();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  const int64_t rows = set_rows(p.set);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    if (!row_taken(p.set, row)) continue;
    quantize_row<kDtype>(p, static_cast<const char*>(p.q.in) + row * p.q.in_stride, p.q.codes + row * p.q.codes_stride,
                         reinterpret_cast<float*>(reinterpret_cast<char*>(p.q.scales) + row * p.q.scales_stride),
                         lane);
  }
}

}  // namespace
}  // namespace wire

cudaError_t launch_quantize_rows(const WireQuantizeRows& q, const WireRowSet& rows, int32_t max_blocks, int32_t pdl,
                                 cudaStream_t stream) {
  const int bytes = q.dtype == kCombineFp32 ? 4 : 2;
  const bool dtype_ok = q.dtype == kCombineBf16 || q.dtype == kCombineFp16 || q.dtype == kCombineFp32;
  if (!dtype_ok || (q.scale_rule != kWireScaleFp32 && q.scale_rule != kWireScaleUe8m0) || q.elems < 1 ||
      !wire::valid_row_set(rows) || max_blocks < 1 || q.in_stride < int64_t{q.elems} * bytes ||
      reinterpret_cast<uintptr_t>(q.in) % bytes != 0 || q.in_stride % bytes != 0 || q.codes_stride < q.elems ||
      q.scales_stride < int64_t{wire_row_blocks(q.elems)} * 4 ||
      reinterpret_cast<uintptr_t>(q.scales) % 4 != 0 || q.scales_stride % 4 != 0) {
    return cudaErrorInvalidValue;
  }
  if (wire::set_rows(rows) == 0) return cudaSuccess;
  const bool vectors = q.elems % wire::kLaneElems == 0 && reinterpret_cast<uintptr_t>(q.in) % 16 == 0 &&
                       q.in_stride % 16 == 0 && reinterpret_cast<uintptr_t>(q.codes) % 8 == 0 &&
                       q.codes_stride % 8 == 0;
  const wire::QuantizeParams p{q, rows, vectors ? 1 : 0};
  const int blocks = wire::wire_grid(rows, max_blocks);
  switch (q.dtype) {
    case kCombineBf16:
      return launch_kernel(wire::quantize_kernel<kCombineBf16>, blocks, wire::kThreads, 0, stream, pdl, p);
    case kCombineFp16:
      return launch_kernel(wire::quantize_kernel<kCombineFp16>, blocks, wire::kThreads, 0, stream, pdl, p);
    default: return launch_kernel(wire::quantize_kernel<kCombineFp32>, blocks, wire::kThreads, 0, stream, pdl, p);
  }
}

}  // namespace kernels
}  // namespace moe_ep
