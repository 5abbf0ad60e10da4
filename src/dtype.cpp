#include "dtype.hpp"

#include <cmath>
#include <cstring>

#include "checked_math.hpp"
#include "error.hpp"

namespace moe_ep {

std::string dtype_name(const moe_ep_dtype_t& d) {
  if (d.lanes == 1) {
    switch (d.code) {
      case MOE_EP_DTYPE_BFLOAT:
        if (d.bits == 16) return "bf16";
        break;
      case MOE_EP_DTYPE_FLOAT:
        if (d.bits == 16 || d.bits == 32 || d.bits == 64) return "fp" + std::to_string(d.bits);
        break;
      case MOE_EP_DTYPE_INT: return "int" + std::to_string(d.bits);
      case MOE_EP_DTYPE_UINT: return "uint" + std::to_string(d.bits);
      case MOE_EP_DTYPE_FLOAT8_E4M3FN:
        if (d.bits == 8) return "float8_e4m3fn";
        break;
      case MOE_EP_DTYPE_FLOAT8_E5M2:
        if (d.bits == 8) return "float8_e5m2";
        break;
      case MOE_EP_DTYPE_FLOAT4_E2M1FN:
        if (d.bits == 4) return "float4_e2m1fn";
        break;
      default: break;
    }
  }
  return "dtype(code=" + std::to_string(d.code) + ",bits=" + std::to_string(d.bits) +
         ",lanes=" + std::to_string(d.lanes) + ")";
}

uint64_t dtype_row_bytes(const moe_ep_dtype_t& d, int64_t elems) {
  if (elems < 0) fail_argument("element count", ">= 0", elems);
  const uint64_t bits_per_elem = static_cast<uint64_t>(d.bits) * d.lanes;  // < 2^24
  const uint64_t bits = checked_mul(bits_per_elem, static_cast<uint64_t>(elems), "row of " + dtype_name(d));
  return bits / 8 + (bits % 8 != 0 ? 1 : 0);
}

bool is_combine_dtype(const moe_ep_dtype_t& d) {
  return d == dtype_bf16() || d == dtype_fp16() || d == dtype_fp32();
}

float bf16_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint16_t float_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  if (std::isnan(value)) return static_cast<uint16_t>((u >> 16) | 0x40);
  const uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1;
  const uint32_t exponent = (h >> 10) & 0x1F;
  const uint32_t mantissa = h & 0x3FF;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? std::nanf("") : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t float_to_fp16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof(u));
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t abs = u & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00;  // NaN
  if (abs >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65520: inf
  if (abs < 0x38800000) {                        // below the smallest normal half
    // Subnormal half: value / 2^-24, rounded to nearest even, done in float.
    float f;
    const uint32_t a = abs;
    std::memcpy(&f, &a, sizeof(f));
    const float scaled = f * 16777216.0f;  // exact (power of two)
    const float rounded = std::nearbyint(scaled);  // default mode: nearest even
    return sign | static_cast<uint16_t>(rounded);
  }
  const uint32_t exponent = ((abs >> 23) - 127 + 15);
  uint32_t mantissa = abs & 0x7FFFFF;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float load_as_float(const moe_ep_dtype_t& d, const void* row, int64_t i) {
  if (d.bits == 32) return static_cast<const float*>(row)[i];
  const uint16_t bits = static_cast<const uint16_t*>(row)[i];
  return d.code == MOE_EP_DTYPE_BFLOAT ? bf16_to_float(bits) : fp16_to_float(bits);
}

void store_from_float(const moe_ep_dtype_t& d, void* row, int64_t i, float value) {
  if (d.bits == 32) {
    static_cast<float*>(row)[i] = value;
  } else {
    static_cast<uint16_t*>(row)[i] =
        d.code == MOE_EP_DTYPE_BFLOAT ? float_to_bf16(value) : float_to_fp16(value);
  }
}

}  // namespace moe_ep
