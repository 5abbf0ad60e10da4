// Host dtype conversions (used by the HOST backend and the GPU oracle): exact
// values, round to nearest even, special values.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "dtype.hpp"

using namespace moe_ep;

TEST_CASE("bf16 conversions round to nearest even", "[dtype]") {
  CHECK(float_to_bf16(1.0f) == 0x3F80);
  CHECK(float_to_bf16(-2.0f) == 0xC000);
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  // 1 + 2^-8 is exactly half way between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);
  // 1 + 3*2^-8 is half way between 1+2^-7 (odd) and 1+2^-6 (even): rounds up.
  CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -12)) == 0x3F81);
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(bf16_to_float(float_to_bf16(INFINITY)) == INFINITY);
}

TEST_CASE("fp16 conversions: normals, subnormals, overflow, ties", "[dtype]") {
  CHECK(float_to_fp16(1.0f) == 0x3C00);
  CHECK(float_to_fp16(-2.5f) == 0xC100);
  CHECK(float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(float_to_fp16(65520.0f) == 0x7C00);  // rounds past the largest half: inf
  CHECK(float_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(float_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even: 0
  CHECK(float_to_fp16(3 * std::ldexp(1.0f, -25)) == 0x0002);  // 1.5 ulp: tie to even 2
  CHECK(float_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie to even
  CHECK(float_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);
  for (uint32_t h = 0; h < 0x7C00; h += 7) {  // every 7th finite positive half round-trips
    CHECK(float_to_fp16(fp16_to_float(static_cast<uint16_t>(h))) == h);
  }
  CHECK(std::isnan(fp16_to_float(0x7E00)));
  CHECK(fp16_to_float(0xFC00) == -INFINITY);
}

TEST_CASE("dtype names and row bytes", "[dtype]") {
  CHECK(dtype_name(dtype_bf16()) == "bf16");
  CHECK(dtype_name(dtype_fp32()) == "fp32");
  CHECK(dtype_name(dtype_int32()) == "int32");
  CHECK(dtype_name(make_dtype(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8)) == "float8_e4m3fn");
  CHECK(dtype_row_bytes(dtype_bf16(), 7168) == 14336);
  CHECK(dtype_row_bytes(make_dtype(MOE_EP_DTYPE_FLOAT4_E2M1FN, 4), 7) == 4);
  CHECK(is_combine_dtype(dtype_fp16()));
  CHECK_FALSE(is_combine_dtype(dtype_int32()));
}
