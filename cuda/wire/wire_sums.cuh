// Sums of FP8 wire rows, shared by both GPU backends' combine: a lane's 8
// consecutive elements of a token, each row's codes dequantized (as
// dequantize_code does) and added in fp32 in the order the caller gives the
// rows, then stored as the combine dtype.  The bits are those of the HOST
// backend (src/wire_format.cpp, docs/semantics.md "A low-precision wire").
#pragma once

#include <stdint.h>

#include "wire/wire_rows.cuh"

namespace moe_ep {
namespace kernels {
namespace wire {

// Adds the 8 codes of `codes` (the low byte of .x first) in a block of
// `scale` into acc.
__device__ __forceinline__ void add_wire_lane(float (&acc)[kLaneElems], const uint2& codes, float scale) {
#pragma unroll
  for (int k = 0; k < kLaneElems / 2; ++k) {
    const uint32_t word = k < 2 ? codes.x : codes.y;
    float lo, hi;
    dequantize_pair((word >> (16 * (k % 2))) & 0xFFFFu, scale, lo, hi);
    acc[2 * k] += lo;
    acc[2 * k + 1] += hi;
  }
}

// The lane's 8 codes of a wire row from element `first` on, of a row of `n`
// elements: one 8-byte load with `vector` (n a multiple of 8), else byte by
// byte (0 past the row).  L2 loads: the rows may have been written by a peer
// during the kernel.
__device__ __forceinline__ uint2 load_wire_lane(const char* row, int32_t first, int32_t n, bool vector) {
  if (vector) return __ldcg(reinterpret_cast<const uint2*>(row + first));
  const unsigned char* c = reinterpret_cast<const unsigned char*>(row);
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int k = 0; k < kLaneElems; ++k) {
    if (first + k < n) w[k / 4] |= static_cast<uint32_t>(__ldcg(c + first + k)) << (8 * (k % 4));
  }
  return make_uint2(w[0], w[1]);
}

// Stores a lane's 8 sums at element `first` of an output row of `n`
// elements: 16-byte stores with `vector` (the row 16-byte aligned, n a
// multiple of 8), else element by element.  A NaN sum: the hardware's
// addition returns its one canonical NaN where the host's keeps the NaN
// operand, here always the positive quiet NaN that dequantizing a NaN code
// gives (the quantizer writes no negative NaN); the sum stores that one.
template <typename Element>
__device__ __forceinline__ void store_lane_sums(char* out, int32_t first, int32_t n, bool vector,
                                                float (&acc)[kLaneElems]) {
  using Bits = typename Element::Bits;
#pragma unroll
  for (int k = 0; k < kLaneElems; ++k) acc[k] = acc[k] == acc[k] ? acc[k] : __uint_as_float(0x7FC00000u);
  if (vector) {
    constexpr int V = static_cast<int>(16 / sizeof(Bits));
#pragma unroll
    for (int k = 0; k < kLaneElems; k += V) {
      float part[V];
#pragma unroll
      for (int j = 0; j < V; ++j) part[j] = acc[k + j];
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(first + k) * sizeof(Bits)) = Element::store_vector(part);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kLaneElems; ++k) {
      if (first + k < n) reinterpret_cast<Bits*>(out)[first + k] = Element::store(acc[k]);
    }
  }
}

}  // namespace wire
}  // namespace kernels
}  // namespace moe_ep
