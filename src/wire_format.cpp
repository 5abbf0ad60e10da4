#include "wire_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dtype.hpp"

namespace moe_ep {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// 2^e for e in [-149, 127], built from the bits (exact, no libm).
float power_of_two(int32_t e) {
  if (e >= -126) return bits_float(static_cast<uint32_t>(e + 127) << 23);
  return bits_float(uint32_t{1} << (e + 149));
}

}  // namespace

uint8_t float_to_e4m3(float value) {
  const uint32_t u = float_bits(value);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return kE4m3NaN;
  if (a >= float_bits(kE4m3Max)) return sign | 0x7E;  // 448 and above, Inf included
  if (a < 0x3C800000u) {                              // below 2^-6, the smallest normal: multiples of 2^-9
    // |value| * 2^9 is exact; its nearest-even integer is the code (8 = 2^-6).
    const float scaled = bits_float(a) * 512.0f;
    const float r = std::nearbyint(scaled);  // the default rounding mode: to nearest even
    return sign | static_cast<uint8_t>(r);
  }
  // Normal: keep 3 of the 23 mantissa bits, round to nearest even on the bits.
  const uint32_t lsb = (a >> 20) & 1u;
  const uint32_t rounded = (a + 0x7FFFFu + lsb) >> 20;  // biased fp32 exponent << 3 | mantissa
  const uint32_t code = rounded - (120u << 3);          // rebias 127 -> 7
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, 0x7E));
}

float e4m3_to_float(uint8_t bits) {
  const uint32_t exp = (bits >> 3) & 0xF, man = bits & 7u;
  const bool negative = (bits & 0x80) != 0;
  if (exp == 0xF && man == 7) return bits_float(0x7FC00000u | (negative ? 0x80000000u : 0));
  float mag;
  if (exp == 0) {
    mag = static_cast<float>(man) * power_of_two(-9);
  } else {
    mag = bits_float(((exp + 120u) << 23) | (man << 20));
  }
  return negative ? -mag : mag;
}

float wire_block_scale(float amax, int32_t rule) {
  if (!(amax > 0.0f)) return 1.0f;
  if (rule == MOE_EP_WIRE_SCALE_UE8M0) {
    // The smallest e with 448 * 2^e >= amax.  amax = 1.f * 2^k (normalised),
    // 448 = 1.75 * 2^8: e = k - 8 when 1.f <= 1.75, else k - 7.
    uint32_t u = float_bits(amax);
    int32_t k = static_cast<int32_t>(u >> 23) - 127;
    uint32_t man = u & 0x7FFFFFu;
    if ((u >> 23) == 0) {  // subnormal: normalise the mantissa
      k = -126;
      while ((man & 0x800000u) == 0) {
        man <<= 1;
        --k;
      }
      man &= 0x7FFFFFu;
    }
    const int32_t e = man <= 0x600000u ? k - 8 : k - 7;
    return power_of_two(std::max(e, kUe8m0MinExponent));
  }
  const float s = amax / kE4m3Max;
  return s > 0.0f ? s : power_of_two(-149);  // an amax below 448 * 2^-150 would give 0
}

void quantize_row(const moe_ep_dtype_t& dtype, const void* row, int64_t elems, int32_t rule, uint8_t* values,
                  float* scales) {
  for (int64_t b = 0; b < elems; b += kWireBlock) {
    const int64_t end = std::min<int64_t>(elems, b + kWireBlock);
    float amax = 0.0f;
    for (int64_t i = b; i < end; ++i) {
      const float x = std::fabs(load_as_float(dtype, row, i));
      if (std::isfinite(x)) amax = std::max(amax, x);
    }
    const float scale = wire_block_scale(amax, rule);
    scales[b / kWireBlock] = scale;
    for (int64_t i = b; i < end; ++i) values[i] = float_to_e4m3(load_as_float(dtype, row, i) / scale);
  }
}

void dequantize_row_fp32(const uint8_t* values, const float* scales, int64_t elems, float* out) {
  for (int64_t i = 0; i < elems; ++i) out[i] = e4m3_to_float(values[i]) * scales[i / kWireBlock];
}

void dequantize_row(const uint8_t* values, const float* scales, int64_t elems, const moe_ep_dtype_t& dtype, void* out) {
  for (int64_t i = 0; i < elems; ++i) {
    store_from_float(dtype, out, i, e4m3_to_float(values[i]) * scales[i / kWireBlock]);
  }
}

}  // namespace moe_ep
