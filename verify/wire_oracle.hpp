// The oracle's FP8 wire (docs/semantics.md, "A low-precision wire"), written
// from the rules, not from src/wire_format.cpp: values are found by searching
// the e4m3fn value table, scales by searching the powers of two, and the fp32
// operations are done in double and rounded once (exact for one division or
// product: double has more than 2 * 24 + 2 bits).
#pragma once

#include <cstdint>

#include "moe_ep_c.h"

namespace moe_ep_verify {

constexpr int32_t kOracleWireBlock = 128;

// params->wire_scale values, as the header defines them.
enum class WireScale { fp32 = MOE_EP_WIRE_SCALE_FP32, ue8m0 = MOE_EP_WIRE_SCALE_UE8M0 };

// The value of an e4m3fn code (NaN for 0x7F and 0xFF).
double e4m3_value(uint8_t code);
// The nearest e4m3fn code to `value` (ties to the even code), +-448 beyond,
// 0x7F for NaN.
uint8_t e4m3_nearest(float value);
// A block's scale from its largest finite magnitude.
float oracle_block_scale(float amax, WireScale rule);

int32_t oracle_wire_blocks(int64_t elems);
// One row of bf16, fp16 or fp32 into codes[elems] and scales[blocks].
void oracle_quantize_row(const moe_ep_dtype_t& dtype, const void* row, int64_t elems, WireScale rule, uint8_t* codes,
                         float* scales);
// code * scale in fp32.
float oracle_dequantize(uint8_t code, float scale);
// An FP8 combine wire's effect on one row: `values` (n values of `dtype`,
// already rounded to it) quantized per block and dequantized back to fp32.
void oracle_wire_round_trip(const moe_ep_dtype_t& dtype, float* values, int64_t n, WireScale rule);

}  // namespace moe_ep_verify
