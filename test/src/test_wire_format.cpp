// The FP8 wire (docs/semantics.md, "A low-precision wire"): the host
// quantizer (src/wire_format.cpp) against the oracle's independent one
// (verify/wire_oracle.cpp), bit for bit, and the validation of the wire params.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend_table.hpp"
#include "dtypes.hpp"
#include "error.hpp"
#include "moe_ep_c.h"
#include "params.hpp"
#include "rank_handles.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"
#include "wire_format.hpp"
#include "wire_oracle.hpp"

using Catch::Matchers::Contains;

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool same_bits(float a, float b) { return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b)); }

// Counts the fp32 patterns where the host and the oracle disagree, printing the first few.
struct Mismatches {
  int count = 0;
  void check_value(uint32_t pattern) {
    const float x = float_of(pattern);
    const uint8_t host = moe_ep::float_to_e4m3(x), oracle = moe_ep_verify::e4m3_nearest(x);
    if (host != oracle && ++count <= 5) {
      UNSCOPED_INFO("fp32 0x" << std::hex << pattern << ": host 0x" << int(host) << ", oracle 0x" << int(oracle));
    }
  }
  void check_scale(float amax, int32_t rule) {
    const float host = moe_ep::wire_block_scale(amax, rule);
    const float oracle = moe_ep_verify::oracle_block_scale(amax, static_cast<moe_ep_verify::WireScale>(rule));
    if (!same_bits(host, oracle) && ++count <= 5) {
      UNSCOPED_INFO("amax 0x" << std::hex << bits_of(amax) << " rule " << rule << ": host 0x" << bits_of(host)
                              << ", oracle 0x" << bits_of(oracle));
    }
  }
};

moe_ep_dtype_t dtype(uint8_t code, uint8_t bits) { return moe_ep_dtype_t{code, bits, 1}; }

std::string params_error(const moe_ep_params_t& p) {
  try {
    moe_ep::make_layout(moe_ep::read_params(&p), 2, 0);
    return "MOE_EP_SUCCESS";
  } catch (const moe_ep::Error& e) {
    return std::string(moe_ep_status_string(e.status())) + ": " + e.what();
  }
}

moe_ep_params_t fp8_params() {
  moe_ep_params_t p = moe_ep_test::make_params(8, 2, 4, 16);
  p.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  return p;
}

}  // namespace

TEST_CASE("wire: every e4m3fn code decodes to the same value in the host and the oracle, and encodes back", "[wire]") {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    const float host = moe_ep::e4m3_to_float(code);
    const double oracle = moe_ep_verify::e4m3_value(code);
    INFO("code 0x" << std::hex << c);
    if ((c & 0x7F) == 0x7F) {
      CHECK(std::isnan(host));
      CHECK(std::isnan(oracle));
      CHECK(moe_ep::float_to_e4m3(host) == moe_ep::kE4m3NaN);
      continue;
    }
    CHECK(static_cast<double>(host) == oracle);
    CHECK(std::signbit(host) == ((c & 0x80) != 0));
    CHECK(moe_ep::float_to_e4m3(host) == code);
    CHECK(moe_ep_verify::e4m3_nearest(host) == code);
  }
  CHECK(moe_ep::e4m3_to_float(0x7E) == 448.0f);
  CHECK(moe_ep::e4m3_to_float(0x01) == std::ldexp(1.0f, -9));  // the smallest subnormal
  CHECK(moe_ep::e4m3_to_float(0x08) == std::ldexp(1.0f, -6));  // the smallest normal
}

TEST_CASE("wire: fp32 to e4m3fn near every rounding boundary, subnormals, saturation, NaN and Inf", "[wire]") {
  Mismatches m;
  // Every fp32 pattern within 40 ulps of each e4m3 value and of each midpoint
  // between neighbours (the ties), both signs.
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = moe_ep_verify::e4m3_value(static_cast<uint8_t>(c));
    const double hi = moe_ep_verify::e4m3_value(static_cast<uint8_t>(c + 1));
    for (double centre : {lo, (lo + hi) / 2, hi}) {
      const uint32_t u = bits_of(static_cast<float>(centre));
      for (int64_t d = -40; d <= 40; ++d) {
        const int64_t pattern = static_cast<int64_t>(u) + d;
        if (pattern < 0 || pattern > 0x7F800000) continue;
        m.check_value(static_cast<uint32_t>(pattern));
        m.check_value(static_cast<uint32_t>(pattern) | 0x80000000u);
      }
    }
  }
  // Saturation: 448, the midpoint 464 towards the next (absent) value 480, and beyond.
  for (float centre : {448.0f, 464.0f, 480.0f, 1e30f, std::numeric_limits<float>::max()}) {
    for (int64_t d = -40; d <= 40; ++d) {
      const int64_t pattern = static_cast<int64_t>(bits_of(centre)) + d;
      if (pattern > 0x7F800000) continue;
      m.check_value(static_cast<uint32_t>(pattern));
      m.check_value(static_cast<uint32_t>(pattern) | 0x80000000u);
    }
  }
  // fp32 subnormals and the first normals, every NaN class and Inf.
  for (uint32_t pattern = 0; pattern < 0x01000000u; pattern += 97) m.check_value(pattern);
  for (uint32_t pattern : {0x7F800000u, 0xFF800000u, 0x7F800001u, 0x7FC00000u, 0xFFC00000u, 0xFFFFFFFFu, 0x80000000u})
    m.check_value(pattern);
  // A stride through every pattern.
  for (uint64_t pattern = 0; pattern <= 0xFFFFFFFFull; pattern += 65521) m.check_value(static_cast<uint32_t>(pattern));
  CHECK(m.count == 0);

  CHECK(moe_ep::float_to_e4m3(std::numeric_limits<float>::infinity()) == 0x7E);
  CHECK(moe_ep::float_to_e4m3(-std::numeric_limits<float>::infinity()) == 0xFE);
  CHECK(moe_ep::float_to_e4m3(std::nanf("")) == 0x7F);
  CHECK(moe_ep::float_to_e4m3(-std::nanf("")) == 0x7F);
  CHECK(moe_ep::float_to_e4m3(-0.0f) == 0x80);
  CHECK(moe_ep::float_to_e4m3(463.99f) == 0x7E);
  CHECK(moe_ep::float_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);  // a tie between 0 and 2^-9: even is 0
  CHECK(moe_ep::float_to_e4m3(std::ldexp(3.0f, -10)) == 0x02);  // a tie between 1 and 2 (x 2^-9): 2
  CHECK(moe_ep::float_to_e4m3(std::ldexp(1.0f, -10) * 1.0001f) == 0x01);
}

TEST_CASE("wire: block scales under both rules, host against oracle", "[wire]") {
  Mismatches m;
  std::vector<float> amaxes = {0.0f,
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               std::numeric_limits<float>::max(),
                               1.0f,
                               448.0f,
                               447.99997f,
                               448.00003f,
                               896.0f,
                               1e-40f,
                               1e-44f,
                               3.0e-43f};
  for (int e = -149; e <= 127; ++e) {
    for (double f : {1.0, 1.75, 1.5, 1.9999999}) {
      const float centre = static_cast<float>(std::ldexp(f * 448.0 / 256.0, e));
      if (!std::isfinite(centre)) continue;
      for (int d = -3; d <= 3; ++d) {
        const int64_t pattern = static_cast<int64_t>(bits_of(centre)) + d;
        if (pattern >= 0 && pattern < 0x7F800000) amaxes.push_back(float_of(static_cast<uint32_t>(pattern)));
      }
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) amaxes.push_back(float_of(rng() % 0x7F800000u));
  for (float amax : amaxes) {
    m.check_scale(amax, MOE_EP_WIRE_SCALE_FP32);
    m.check_scale(amax, MOE_EP_WIRE_SCALE_UE8M0);
  }
  CHECK(m.count == 0);

  CHECK(moe_ep::wire_block_scale(0.0f, MOE_EP_WIRE_SCALE_FP32) == 1.0f);
  CHECK(moe_ep::wire_block_scale(0.0f, MOE_EP_WIRE_SCALE_UE8M0) == 1.0f);
  CHECK(moe_ep::wire_block_scale(448.0f, MOE_EP_WIRE_SCALE_UE8M0) == 1.0f);
  CHECK(moe_ep::wire_block_scale(448.00003f, MOE_EP_WIRE_SCALE_UE8M0) == 2.0f);
  CHECK(moe_ep::wire_block_scale(1.0f, MOE_EP_WIRE_SCALE_UE8M0) == 1.0f / 256.0f);  // 448/512 < 1 <= 448/256
  CHECK(moe_ep::wire_block_scale(std::numeric_limits<float>::denorm_min(), MOE_EP_WIRE_SCALE_UE8M0) ==
        std::ldexp(1.0f, -127));
  CHECK(moe_ep::wire_block_scale(std::numeric_limits<float>::denorm_min(), MOE_EP_WIRE_SCALE_FP32) ==
        std::numeric_limits<float>::denorm_min());
  // UE8M0 scales are powers of two with 448 * scale >= amax > 224 * scale (above the clamp).
  for (float amax : {1e-30f, 3.14159f, 65504.0f, 3e38f}) {
    const float s = moe_ep::wire_block_scale(amax, MOE_EP_WIRE_SCALE_UE8M0);
    int exponent = 0;
    CHECK(std::frexp(s, &exponent) == 0.5f);
    CHECK(448.0 * s >= amax);
    CHECK(224.0 * s < amax);
  }
}

TEST_CASE("wire: rows of every dtype and size quantize and dequantize bit for bit like the oracle", "[wire]") {
  std::mt19937 rng(11);
  for (const moe_ep_dtype_t dt :
       {dtype(MOE_EP_DTYPE_BFLOAT, 16), dtype(MOE_EP_DTYPE_FLOAT, 16), dtype(MOE_EP_DTYPE_FLOAT, 32)}) {
    for (int64_t elems : {1, 100, 127, 128, 129, 255, 7168}) {
      for (int32_t rule : {MOE_EP_WIRE_SCALE_FP32, MOE_EP_WIRE_SCALE_UE8M0}) {
        INFO("dtype bits " << int(dt.bits) << " code " << int(dt.code) << ", " << elems << " elements, rule " << rule);
        std::vector<uint8_t> row(moe_ep_verify::row_bytes(dt, elems));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::uniform_int_distribution<int> kind(0, 99);
        std::uniform_int_distribution<int> magnitude(-30, 10);
        const int64_t zero_block = elems > 128 ? 1 : -1;  // one block left all zero
        for (int64_t i = 0; i < elems; ++i) {
          float x = std::ldexp(normal(rng), magnitude(rng) / 4);
          const int k = kind(rng);
          if (k == 0) x = std::numeric_limits<float>::quiet_NaN();
          if (k == 1) x = std::numeric_limits<float>::infinity();
          if (k == 2) x = -std::numeric_limits<float>::infinity();
          if (k == 3) x = -0.0f;
          if (k == 4) x = std::ldexp(normal(rng), -20);  // small: subnormal e4m3 results in a large block
          if (i / 128 == zero_block) x = 0.0f;
          moe_ep_verify::store_float(dt, row.data(), i, x);
        }
        const int32_t blocks = moe_ep::wire_blocks(elems);
        REQUIRE(blocks == moe_ep_verify::oracle_wire_blocks(elems));
        std::vector<uint8_t> host_codes(elems), oracle_codes(elems);
        std::vector<float> host_scales(blocks), oracle_scales(blocks);
        moe_ep::quantize_row(dt, row.data(), elems, rule, host_codes.data(), host_scales.data());
        moe_ep_verify::oracle_quantize_row(dt, row.data(), elems, static_cast<moe_ep_verify::WireScale>(rule),
                                           oracle_codes.data(), oracle_scales.data());
        CHECK(host_codes == oracle_codes);
        for (int32_t b = 0; b < blocks; ++b) CHECK(bits_of(host_scales[b]) == bits_of(oracle_scales[b]));
        if (zero_block >= 0) CHECK(host_scales[zero_block] == 1.0f);

        std::vector<float> host_fp32(elems);
        moe_ep::dequantize_row_fp32(host_codes.data(), host_scales.data(), elems, host_fp32.data());
        std::vector<uint8_t> host_out(row.size()), oracle_out(row.size());
        moe_ep::dequantize_row(host_codes.data(), host_scales.data(), elems, dt, host_out.data());
        int wrong = 0;
        for (int64_t i = 0; i < elems; ++i) {
          const float oracle = moe_ep_verify::oracle_dequantize(oracle_codes[i], oracle_scales[i / 128]);
          if (!same_bits(host_fp32[i], oracle)) ++wrong;
          moe_ep_verify::store_float(dt, oracle_out.data(), i, oracle);
          // The error bound of the rules: half an e4m3 step of the value (2^-4
          // relative for normal codes), or half a subnormal step of the block.
          const float x = moe_ep_verify::load_float(dt, row.data(), i);
          if (std::isfinite(x)) {
            const double scale = oracle_scales[i / 128];
            const double bound = std::max(std::fabs(static_cast<double>(x)) / 16, std::ldexp(scale, -10));
            if (std::fabs(static_cast<double>(host_fp32[i]) - x) > bound * (1 + 1e-6)) ++wrong;
          }
        }
        CHECK(wrong == 0);
        CHECK(host_out == oracle_out);
      }
    }
  }
}

TEST_CASE("wire: the params are validated, naming the field, the expected and the actual value", "[wire]") {
  moe_ep_params_t p = fp8_params();
  CHECK(params_error(p) == "MOE_EP_SUCCESS");
  p.dispatch_wire = 2;
  CHECK_THAT(params_error(p), Contains("INVALID_ARGUMENT") && Contains("params->dispatch_wire") &&
                                  Contains("MOE_EP_WIRE_FP8_E4M3_BLOCK128 (1)") && Contains("got 2"));
  p = moe_ep_test::make_params(8, 2, 4, 16);
  p.combine_wire = -1;
  CHECK_THAT(params_error(p), Contains("params->combine_wire") && Contains("got -1"));
  p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  CHECK(params_error(p) == "MOE_EP_SUCCESS");
  p.wire_scale = 2;
  CHECK_THAT(params_error(p), Contains("params->wire_scale") && Contains("UE8M0 (1)") && Contains("got 2"));
  p = moe_ep_test::make_params(8, 2, 4, 16);
  p.wire_scale = MOE_EP_WIRE_SCALE_UE8M0;
  CHECK_THAT(params_error(p),
             Contains("params->wire_scale") && Contains("FP8 dispatch_wire or combine_wire only") && Contains("got 1"));
  p = moe_ep_test::make_params(8, 2, 4, 16);
  p.dispatch_dequantize = 1;
  CHECK_THAT(params_error(p), Contains("params->dispatch_dequantize") && Contains("FP8_E4M3_BLOCK128 only"));
  p = fp8_params();
  p.dispatch_dequantize = 2;
  CHECK_THAT(params_error(p), Contains("params->dispatch_dequantize") && Contains("0 or 1") && Contains("got 2"));
  p = fp8_params();
  p.hidden_dtype = dtype(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
  CHECK_THAT(params_error(p),
             Contains("params->hidden_dtype") && Contains("bf16, fp16 or fp32") && Contains("float8_e4m3fn"));
  p = fp8_params();
  p.scale_row_elems = 1;
  CHECK_THAT(params_error(p),
             Contains("params->scale_row_elems") && Contains("the library makes the scales") && Contains("got 1"));
  // The library's scales take the column-major layout in an expert layout;
  // dequantized rows have none.
  p = fp8_params();
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  p.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
  CHECK(params_error(p) == "MOE_EP_SUCCESS");
  p.dispatch_dequantize = 1;
  CHECK_THAT(params_error(p), Contains("params->scale_layout") && Contains("scale_row_elems is 0"));
}

TEST_CASE("wire: every backend takes both FP8 wires", "[wire]") {
  // The kernels behind them are checked on the GPU (conformance check --wire).
  moe_ep_params_t p = moe_ep_test::make_params(8, 2, 4, 16);
  for (int32_t backend : {MOE_EP_BACKEND_HOST, MOE_EP_BACKEND_NVLINK_TWO_SIDED, MOE_EP_BACKEND_NCCL}) {
    for (int32_t dispatch_wire : {MOE_EP_WIRE_AS_IS, MOE_EP_WIRE_FP8_E4M3_BLOCK128}) {
      for (int32_t combine_wire : {MOE_EP_WIRE_AS_IS, MOE_EP_WIRE_FP8_E4M3_BLOCK128}) {
        INFO("backend " << backend << ", dispatch_wire " << dispatch_wire << ", combine_wire " << combine_wire);
        p.dispatch_wire = dispatch_wire;
        p.combine_wire = combine_wire;
        CHECK_NOTHROW(
            moe_ep::check_backend_capabilities(backend, moe_ep::make_layout(moe_ep::read_params(&p), 2, 0), 1));
      }
    }
  }
}

TEST_CASE("wire: ranks that disagree on a wire field all fail create, naming it", "[wire]") {
  for (const char* field :
       {"params->dispatch_wire", "params->combine_wire", "params->wire_scale", "params->dispatch_dequantize"}) {
    const moe_ep_test::CreateOutcomes created =
        moe_ep_test::create_on_ranks(2, [&](int rank, moe_ep_params_t& p, moe_ep_config_t&) {
          p = fp8_params();
          p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
          if (rank == 1) {
            const std::string f = field;
            if (f == "params->dispatch_wire") p.dispatch_wire = MOE_EP_WIRE_AS_IS;
            if (f == "params->combine_wire") p.combine_wire = MOE_EP_WIRE_AS_IS;
            if (f == "params->wire_scale") p.wire_scale = MOE_EP_WIRE_SCALE_UE8M0;
            if (f == "params->dispatch_dequantize") p.dispatch_dequantize = 1;
          }
        });
    for (int r = 0; r < 2; ++r) {
      INFO(field << ", rank " << r << ": " << created.messages[r]);
      CHECK(created.status[r] == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(created.messages[r], Contains(field) && Contains("rank 1"));
    }
  }
}
