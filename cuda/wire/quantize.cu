// Rows into the FP8 wire (wire_kernels.h): a warp per segment of a row walks
// it in chunks of two 128-element blocks, 8 elements a lane, every chunk's
// loads issued first; each half warp reduces its block's amax over finite
// values with four shuffles, derives the scale, encodes the values
// (encode_lane: a division, or a multiplication by a UE8M0 scale's exact
// reciprocal) and stores the 8 codes with one 8-byte store.
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

// The lane's 8 elements from element `first` on, as fp32 (0 past the row).
template <class E>
__device__ __forceinline__ void load_lane(const char* src, int32_t first, int32_t n, bool vectors,
                                          float (&v)[kLaneElems]) {
  if (vectors && first < n) {
    load_vector<E>(src + static_cast<int64_t>(first) * E::kBytes, v);
  } else {
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) {
      v[k] = first + k < n ? E::load(src + static_cast<int64_t>(first + k) * E::kBytes) : 0.0f;
    }
  }
}

// The lane's 8 elements of a chunk into codes and, from one lane per half
// warp, its block's scale.
__device__ __forceinline__ void quantize_chunk(const QuantizeParams& p, const float (&v)[kLaneElems], int32_t base,
                                               uint8_t* codes, float* scales, int lane) {
  const int32_t n = p.q.elems;
  const int32_t first = base + lane * kLaneElems;
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < kLaneElems; ++k) amax = finite_max(amax, v[k]);
#pragma unroll
  for (int d = 8; d >= 1; d /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
  const float scale = block_scale(amax, p.q.scale_rule);
  const int32_t block_first = base + (lane & 16) * kLaneElems;
  if ((lane & 15) == 0 && block_first < n) scales[block_first / kWireBlockElems] = scale;
  uint32_t pairs[kLaneElems / 2];
  encode_lane(v, scale, p.q.scale_rule, pairs);
  if (p.vectors != 0 && first < n) {
    *reinterpret_cast<uint2*>(codes + first) = make_uint2(pairs[0] | pairs[1] << 16, pairs[2] | pairs[3] << 16);
  } else {
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) {
      if (first + k < n) codes[first + k] = static_cast<uint8_t>(pairs[k / 2] >> (8 * (k % 2)));
    }
  }
}

// A segment of a row: every chunk's loads first, then each chunk's block
// reductions, divisions and stores.  A chunk that starts past the row is
// skipped by the whole warp (the shuffles stay convergent).
template <int kDtype>
__device__ __forceinline__ void quantize_segment(const QuantizeParams& p, const char* src, uint8_t* codes,
                                                 float* scales, int32_t start, int lane) {
  const int32_t n = p.q.elems;
  float v[kSegmentChunks][kLaneElems];
#pragma unroll
  for (int i = 0; i < kSegmentChunks; ++i) {
    load_lane<Elements<kDtype>>(src, start + i * kChunkElems + lane * kLaneElems, n, p.vectors != 0, v[i]);
  }
#pragma unroll
  for (int i = 0; i < kSegmentChunks; ++i) {
    if (start + i * kChunkElems < n) quantize_chunk(p, v[i], start + i * kChunkElems, codes, scales, lane);
  }
}

template <int kDtype>
__global__ void __launch_bounds__(kThreads, 1) quantize_kernel(const QuantizeParams p) {
  wait_for_prior_grid();
  allow_dependent_launch();
  const int lane = threadIdx.x % 32;
  for_each_segment(p.set, p.q.elems, [&](int64_t row, int32_t start) {
    quantize_segment<kDtype>(p, static_cast<const char*>(p.q.in) + row * p.q.in_stride,
                             p.q.codes + row * p.q.codes_stride,
                             reinterpret_cast<float*>(reinterpret_cast<char*>(p.q.scales) + row * p.q.scales_stride),
                             start, lane);
  });
}

}  // namespace
}  // namespace wire

cudaError_t launch_quantize_rows(const WireQuantizeRows& q, const WireRowSet& rows, int32_t max_blocks, int32_t pdl,
                                 cudaStream_t stream) {
  const int bytes = q.dtype == kCombineFp32 ? 4 : 2;
  const bool dtype_ok = q.dtype == kCombineBf16 || q.dtype == kCombineFp16 || q.dtype == kCombineFp32;
  if (!dtype_ok || (q.scale_rule != kWireScaleFp32 && q.scale_rule != kWireScaleUe8m0) || q.elems < 1 ||
      !wire::valid_row_set(rows, q.elems) || max_blocks < 1 || q.in_stride < int64_t{q.elems} * bytes ||
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
  const int blocks = wire::wire_grid(rows, q.elems, max_blocks);
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
