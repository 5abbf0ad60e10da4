// DLPack dtypes by name, their byte sizes, and float conversions for the
// combine dtypes.  Written here, not borrowed from src/dtype.cpp, so that the
// oracle is independent of the library it checks.
#pragma once

#include <cstdint>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep_verify {

inline moe_ep_dtype_t int32_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}; }
inline moe_ep_dtype_t uint8_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_UINT, 8, 1}; }
inline moe_ep_dtype_t fp32_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1}; }
inline moe_ep_dtype_t fp16_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 16, 1}; }
inline moe_ep_dtype_t bf16_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}; }
inline moe_ep_dtype_t fp8_e4m3_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1}; }
inline moe_ep_dtype_t fp4_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT4_E2M1FN, 4, 1}; }

// "bf16", "fp16", "fp32", "fp8" (= e4m3fn), "fp8_e4m3", "fp8_e5m2", "fp4"
// (= float4_e2m1fn, packed two per byte), "int32", "uint8".  Throws
// std::invalid_argument on others.
moe_ep_dtype_t parse_dtype(const std::string& name);
std::string dtype_name(const moe_ep_dtype_t& dtype);
bool same_dtype(const moe_ep_dtype_t& a, const moe_ep_dtype_t& b);

// Bytes of `elems` elements, sub-byte types packed and rounded up.
uint64_t row_bytes(const moe_ep_dtype_t& dtype, int64_t elems);
// The unit in which wrong payload is counted: one element, or one byte for
// sub-byte types.
uint64_t compare_unit_bytes(const moe_ep_dtype_t& dtype);

bool is_float_dtype(const moe_ep_dtype_t& dtype);  // bf16, fp16, fp32

float bf16_bits_to_float(uint16_t bits);
uint16_t float_to_bf16_bits(float value);  // round to nearest even
float fp16_bits_to_float(uint16_t bits);
uint16_t float_to_fp16_bits(float value);  // round to nearest even

// Element i of a bf16/fp16/fp32 array, as float; and the reverse (rounded).
float load_float(const moe_ep_dtype_t& dtype, const void* data, int64_t i);
void store_float(const moe_ep_dtype_t& dtype, void* data, int64_t i, float value);

}  // namespace moe_ep_verify
