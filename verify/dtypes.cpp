#include "dtypes.hpp"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace moe_ep_verify {

namespace {
moe_ep_dtype_t make(uint8_t code, uint8_t bits) { return moe_ep_dtype_t{code, bits, 1}; }

struct Named {
  const char* name;
  moe_ep_dtype_t dtype;
};
const Named kNames[] = {
    {"bf16", make(MOE_EP_DTYPE_BFLOAT, 16)},
    {"fp16", make(MOE_EP_DTYPE_FLOAT, 16)},
    {"fp32", make(MOE_EP_DTYPE_FLOAT, 32)},
    {"fp8", make(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8)},
    {"fp8_e4m3", make(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8)},
    {"fp8_e5m2", make(MOE_EP_DTYPE_FLOAT8_E5M2, 8)},
    {"fp4", make(MOE_EP_DTYPE_FLOAT4_E2M1FN, 4)},
    {"int32", make(MOE_EP_DTYPE_INT, 32)},
    {"uint8", make(MOE_EP_DTYPE_UINT, 8)},
};
}  // namespace

moe_ep_dtype_t parse_dtype(const std::string& name) {
  for (const Named& n : kNames) {
    if (name == n.name) return n.dtype;
  }
  throw std::invalid_argument("unknown dtype '" + name +
                              "' (expected bf16, fp16, fp32, fp8, fp8_e4m3, fp8_e5m2, fp4, int32 or uint8)");
}

std::string dtype_name(const moe_ep_dtype_t& dtype) {
  for (const Named& n : kNames) {
    if (same_dtype(dtype, n.dtype)) return n.name;
  }
  return "dtype(" + std::to_string(dtype.code) + "," + std::to_string(dtype.bits) + ")";
}

bool same_dtype(const moe_ep_dtype_t& a, const moe_ep_dtype_t& b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

uint64_t row_bytes(const moe_ep_dtype_t& dtype, int64_t elems) {
  return (static_cast<uint64_t>(dtype.bits) * dtype.lanes * static_cast<uint64_t>(elems) + 7) / 8;
}

uint64_t compare_unit_bytes(const moe_ep_dtype_t& dtype) {
  const uint64_t bytes = static_cast<uint64_t>(dtype.bits) * dtype.lanes / 8;
  return bytes == 0 ? 1 : bytes;
}

bool is_float_dtype(const moe_ep_dtype_t& d) {
  return same_dtype(d, make(MOE_EP_DTYPE_BFLOAT, 16)) || same_dtype(d, make(MOE_EP_DTYPE_FLOAT, 16)) ||
         same_dtype(d, make(MOE_EP_DTYPE_FLOAT, 32));
}

float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t float_to_bf16_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if (std::isnan(value)) return 0x7FC0;
  u += 0x7FFFu + ((u >> 16) & 1u);  // round half to even
  return static_cast<uint16_t>(u >> 16);
}

float fp16_bits_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_fp16_bits(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) return 0x7E00;
  const float a = std::fabs(value);
  if (a >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {          // subnormal: multiples of 2^-24
    const float scaled = a * std::ldexp(1.0f, 24);
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // default mode: to even
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: round m * 2^11 to even; carry may bump the exponent.
  uint32_t significand = static_cast<uint32_t>(std::nearbyint(m * 2048.0f));
  if (significand == 2048) {
    significand = 1024;
    ++e;
  }
  const uint32_t biased = static_cast<uint32_t>(e - 1 + 15);
  return sign | static_cast<uint16_t>((biased << 10) | (significand & 0x3FF));
}

float load_float(const moe_ep_dtype_t& d, const void* data, int64_t i) {
  if (d.bits == 32) {
    float f;
    std::memcpy(&f, static_cast<const char*>(data) + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(data) + 2 * i, 2);
  return d.code == MOE_EP_DTYPE_BFLOAT ? bf16_bits_to_float(h) : fp16_bits_to_float(h);
}

void store_float(const moe_ep_dtype_t& d, void* data, int64_t i, float value) {
  if (d.bits == 32) {
    std::memcpy(static_cast<char*>(data) + 4 * i, &value, 4);
    return;
  }
  const uint16_t h = d.code == MOE_EP_DTYPE_BFLOAT ? float_to_bf16_bits(value) : float_to_fp16_bits(value);
  std::memcpy(static_cast<char*>(data) + 2 * i, &h, 2);
}

}  // namespace moe_ep_verify
