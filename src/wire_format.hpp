// The FP8 wire format on the host (docs/semantics.md, "A low-precision
// wire"): float8 e4m3fn values with one fp32 scale per block of 128 elements
// of a row.  The HOST backend quantizes with it; the GPU kernels must produce
// the same bits.  verify/ has its own implementation of the same rules.
#pragma once

#include <cstdint>

#include "moe_ep_c.h"

namespace moe_ep {

constexpr int32_t kWireBlock = 128;          // elements per scale
constexpr float kE4m3Max = 448.0f;           // the largest finite e4m3fn value
constexpr uint8_t kE4m3NaN = 0x7F;           // every NaN becomes this code
constexpr int32_t kUe8m0MinExponent = -127;  // the smallest UE8M0 scale is 2^-127

// Scales per row of `elems` elements: ceil(elems / 128).
inline int32_t wire_blocks(int64_t elems) { return static_cast<int32_t>((elems + kWireBlock - 1) / kWireBlock); }

// fp32 to e4m3fn: round to nearest even, saturated to +-448 (Inf included),
// NaN to 0x7F.
uint8_t float_to_e4m3(float value);
float e4m3_to_float(uint8_t bits);

// The scale of a block whose largest finite magnitude is `amax` (>= 0) under
// params->wire_scale `rule`: 1.0 when amax is 0.
float wire_block_scale(float amax, int32_t rule);

// Quantizes one row of `elems` elements of `dtype` (bf16, fp16, fp32):
// values[elems] e4m3fn codes, scales[wire_blocks(elems)].
void quantize_row(const moe_ep_dtype_t& dtype, const void* row, int64_t elems, int32_t rule, uint8_t* values,
                  float* scales);
// The reverse: e4m3 value times its block's scale in fp32, stored as `dtype`
// (bf16, fp16, fp32; round to nearest even), or kept in fp32.
void dequantize_row(const uint8_t* values, const float* scales, int64_t elems, const moe_ep_dtype_t& dtype, void* out);
void dequantize_row_fp32(const uint8_t* values, const float* scales, int64_t elems, float* out);

}  // namespace moe_ep
