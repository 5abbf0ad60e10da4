// DLPack dtypes: naming, byte sizes, and the host conversions that the HOST
// backend and the tests share (bf16/fp16 <-> fp32, round to nearest even).
#pragma once

#include <cstdint>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep {

inline moe_ep_dtype_t make_dtype(uint8_t code, uint8_t bits) { return moe_ep_dtype_t{code, bits, 1}; }
inline moe_ep_dtype_t dtype_bf16() { return make_dtype(MOE_EP_DTYPE_BFLOAT, 16); }
inline moe_ep_dtype_t dtype_fp16() { return make_dtype(MOE_EP_DTYPE_FLOAT, 16); }
inline moe_ep_dtype_t dtype_fp32() { return make_dtype(MOE_EP_DTYPE_FLOAT, 32); }
inline moe_ep_dtype_t dtype_int32() { return make_dtype(MOE_EP_DTYPE_INT, 32); }

inline bool operator==(const moe_ep_dtype_t& a, const moe_ep_dtype_t& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool operator!=(const moe_ep_dtype_t& a, const moe_ep_dtype_t& b) { return !(a == b); }

// "bf16", "fp32", "int32", "float8_e4m3fn", or "dtype(code=..,bits=..,lanes=..)".
std::string dtype_name(const moe_ep_dtype_t& dtype);

// Bytes taken by `elems` elements (sub-byte types are packed, rounded up).
uint64_t dtype_row_bytes(const moe_ep_dtype_t& dtype, int64_t elems);

// Whether combine can accumulate this dtype (bf16, fp16, fp32).
bool is_combine_dtype(const moe_ep_dtype_t& dtype);

float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float value);  // round to nearest even, NaN kept quiet
float fp16_to_float(uint16_t bits);
uint16_t float_to_fp16(float value);  // round to nearest even, overflow to inf

// Load element i of a combine-dtype row as float / store a float into one.
float load_as_float(const moe_ep_dtype_t& dtype, const void* row, int64_t i);
void store_from_float(const moe_ep_dtype_t& dtype, void* row, int64_t i, float value);

}  // namespace moe_ep
