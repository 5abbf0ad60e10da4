#include "wire_oracle.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "dtypes.hpp"

namespace moe_ep_verify {

double e4m3_value(uint8_t code) {
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  // Subnormal: mantissa * 2^-9; normal: (8 + mantissa) * 2^(exponent - 10).
  const double magnitude =
      exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -9) : std::ldexp(8.0 + mantissa, exponent - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

uint8_t e4m3_nearest(float value) {
  if (std::isnan(value)) return 0x7F;
  const double v = value;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isinf(value)) return sign | 0x7E;
  const double magnitude = std::fabs(v);
  // The finite non-negative codes 0x00..0x7E ascend with their values: the
  // nearest is one of the two around the magnitude, ties to the even code (a
  // search, not a scan of all 127: the bench checks millions of elements).
  static const std::array<double, 128> values = [] {
    std::array<double, 128> out{};
    for (int code = 0; code <= 0x7E; ++code) out[size_t(code)] = e4m3_value(static_cast<uint8_t>(code));
    out[127] = std::numeric_limits<double>::infinity();  // above every finite magnitude
    return out;
  }();
  int hi = 0;  // the codes below the magnitude, counted without branches (random data)
  for (int step = 64; step > 0; step >>= 1) hi += values[size_t(hi + step - 1)] < magnitude ? step : 0;
  if (hi == 127) return sign | 0x7E;  // beyond 448 the nearest is 448 (saturation), Inf included
  if (hi == 0) return sign;
  const int lo = hi - 1;
  const double below = std::fabs(values[size_t(lo)] - magnitude), over = std::fabs(values[size_t(hi)] - magnitude);
  if (below != over) return sign | static_cast<uint8_t>(below < over ? lo : hi);
  return sign | static_cast<uint8_t>(lo % 2 == 0 ? lo : hi);
}

float oracle_block_scale(float amax, WireScale rule) {
  if (amax == 0.0f) return 1.0f;
  if (rule == WireScale::ue8m0) {
    for (int e = -127;; ++e) {
      if (std::ldexp(448.0, e) >= static_cast<double>(amax)) return static_cast<float>(std::ldexp(1.0, e));
    }
  }
  const float s = static_cast<float>(static_cast<double>(amax) / 448.0);
  return s != 0.0f ? s : static_cast<float>(std::ldexp(1.0, -149));
}

int32_t oracle_wire_blocks(int64_t elems) {
  return static_cast<int32_t>((elems + kOracleWireBlock - 1) / kOracleWireBlock);
}

void oracle_quantize_row(const moe_ep_dtype_t& dtype, const void* row, int64_t elems, WireScale rule, uint8_t* codes,
                         float* scales) {
  for (int32_t block = 0; block < oracle_wire_blocks(elems); ++block) {
    const int64_t first = static_cast<int64_t>(block) * kOracleWireBlock;
    const int64_t last = std::min<int64_t>(elems, first + kOracleWireBlock);
    float amax = 0.0f;
    for (int64_t i = first; i < last; ++i) {
      const float x = load_float(dtype, row, i);
      if (std::isfinite(x) && std::fabs(x) > amax) amax = std::fabs(x);
    }
    const float scale = oracle_block_scale(amax, rule);
    scales[block] = scale;
    for (int64_t i = first; i < last; ++i) {
      const double q = static_cast<double>(load_float(dtype, row, i)) / scale;
      codes[i] = e4m3_nearest(static_cast<float>(q));
    }
  }
}

float oracle_dequantize(uint8_t code, float scale) {
  return static_cast<float>(e4m3_value(code) * static_cast<double>(scale));
}

void oracle_wire_round_trip(const moe_ep_dtype_t& dtype, float* values, int64_t n, WireScale rule) {
  std::vector<uint8_t> row(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) store_float(dtype, row.data(), i, values[i]);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<float> scales(static_cast<size_t>(oracle_wire_blocks(n)));
  oracle_quantize_row(dtype, row.data(), n, rule, codes.data(), scales.data());
  for (int64_t i = 0; i < n; ++i) values[i] = oracle_dequantize(codes[i], scales[i / kOracleWireBlock]);
}

}  // namespace moe_ep_verify
