// Parameter and configuration validation, layout maths and workspace size.
#include <catch2/catch.hpp>

#include <chrono>
#include <climits>
#include <functional>
#include <string>

#include "moe_ep_c.h"
#include "params.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

using Catch::Matchers::Contains;

namespace {

moe_ep_params_t valid_params() { return moe_ep_test::make_params(8, 2, 4, 16); }

// The status and message of workspace_size on params changed by `edit`.
std::pair<moe_ep_status_t, std::string> try_params(const std::function<void(moe_ep_params_t&)>& edit,
                                                   int32_t world_size = 2) {
  moe_ep_params_t p = valid_params();
  edit(p);
  const moe_ep_config_t c = moe_ep_test::host_config();
  uint64_t bytes = 0;
  const moe_ep_status_t s = moe_ep_workspace_size(&p, &c, world_size, &bytes);
  return {s, moe_ep_last_error()};
}

void expect_rejected(const std::function<void(moe_ep_params_t&)>& edit, const std::string& field,
                     const std::string& expected_part, const std::string& actual_part, int32_t world = 2) {
  const auto [status, message] = try_params(edit, world);
  INFO(message);
  CHECK(status == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(message, Contains(field) && Contains("expected") && Contains(expected_part) &&
                          Contains("got " + actual_part));
}

}  // namespace

TEST_CASE("each bad params field is named with expected and actual", "[params]") {
  expect_rejected([](auto& p) { p.num_experts = 0; }, "params->num_experts", "> 0", "0");
  expect_rejected([](auto& p) { p.top_k = -1; }, "params->top_k", "> 0", "-1");
  expect_rejected([](auto& p) { p.top_k = 9; }, "params->top_k", "<= num_experts (8)", "9");
  expect_rejected([](auto& p) { p.max_tokens_per_rank = 0; }, "params->max_tokens_per_rank", "> 0", "0");
  expect_rejected([](auto& p) { p.hidden_size = -5; }, "params->hidden_size", "> 0", "-5");
  expect_rejected([](auto& p) { p.invalid_expert_id = 3; }, "params->invalid_expert_id", "outside [0, num_experts)", "3");
  expect_rejected([](auto& p) { p.enable_eplb_stats = 2; }, "params->enable_eplb_stats", "0 or 1", "2");
  expect_rejected([](auto& p) { p.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}; },
                  "params->combine_dtype", "bf16, fp16 or fp32", "int32");
  expect_rejected([](auto& p) { p.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 12, 1}; },
                  "params->hidden_dtype", "lanes 1", "dtype(code=2,bits=12,lanes=1)");
  expect_rejected([](auto& p) { p.hidden_row_elems = -1; }, "params->hidden_row_elems", ">= 0", "-1");
  expect_rejected([](auto& p) { p.scale_row_elems = -2; }, "params->scale_row_elems", ">= 0", "-2");
  expect_rejected([](auto& p) { p.num_experts = 6; }, "params->num_experts", "a multiple of world_size (4)", "6", 4);
  expect_rejected([](auto&) {}, "world_size", "> 0", "0", 0);
}

TEST_CASE("each bad config field is named", "[params]") {
  const moe_ep_params_t p = valid_params();
  uint64_t bytes = 0;
  auto check = [&](const std::function<void(moe_ep_config_t&)>& edit, const std::string& field, const std::string& actual) {
    moe_ep_config_t c;
    moe_ep_config_init(&c, sizeof c);
    edit(c);
    CHECK(moe_ep_workspace_size(&p, &c, 2, &bytes) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains(field) && Contains("got " + actual));
  };
  check([](auto& c) { c.backend = 7; }, "config->backend", "7");
  check([](auto& c) { c.num_sms = -1; }, "config->num_sms", "-1");
  check([](auto& c) { c.timeout_ms = 0; }, "config->timeout_ms", "0");
  check([](auto& c) { c.device = -3; }, "config->device", "-3");
  CHECK(moe_ep_workspace_size(&p, nullptr, 2, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("bytes"));
}

TEST_CASE("6 experts on 2 ranks and top_k = num_experts are accepted", "[params]") {
  CHECK(try_params([](auto& p) { p.num_experts = 6; p.top_k = 6; }).first == MOE_EP_SUCCESS);
  CHECK(try_params([](auto& p) { p.num_experts = 3; p.top_k = 1; p.invalid_expert_id = 3; }, 3).first == MOE_EP_SUCCESS);
}

TEST_CASE("layout maths: ownership, row bytes, receive rows", "[params]") {
  moe_ep_params_t p = valid_params();
  p.num_experts = 12;
  p.hidden_size = 7;
  p.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT4_E2M1FN, 4, 1};
  p.scale_row_elems = 3;
  p.scale_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
  p.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), 3, 1);
  CHECK(l.experts_per_rank() == 4);
  CHECK(l.owner_of(0) == 0);
  CHECK(l.owner_of(3) == 0);
  CHECK(l.owner_of(4) == 1);
  CHECK(l.owner_of(11) == 2);
  CHECK(l.hidden_row_elems == 7);
  CHECK(l.hidden_row_bytes == 4);  // 7 packed fp4 = 3.5 bytes, rounded up
  CHECK(l.scale_row_bytes == 3);
  CHECK(l.combine_row_bytes == 28);
  CHECK(l.receive_rows(5) == 15);
  CHECK(l.is_valid_expert(11));
  CHECK_FALSE(l.is_valid_expert(12));
  CHECK_FALSE(l.is_valid_expert(-1));
}

TEST_CASE("host workspace size grows with every dimension it depends on", "[params]") {
  auto size = [](const std::function<void(moe_ep_params_t&)>& edit, int world) {
    moe_ep_params_t p = valid_params();
    edit(p);
    const moe_ep_config_t c = moe_ep_test::host_config();
    uint64_t bytes = 0;
    REQUIRE(moe_ep_workspace_size(&p, &c, world, &bytes) == MOE_EP_SUCCESS);
    return bytes;
  };
  const uint64_t base = size([](auto&) {}, 2);
  CHECK(base > 0);
  CHECK(size([](auto& p) { p.max_tokens_per_rank = 8; }, 2) > base);
  CHECK(size([](auto& p) { p.hidden_size = 32; }, 2) > base);
  CHECK(size([](auto&) {}, 4) > base);
  CHECK(size([](auto& p) { p.scale_row_elems = 4; }, 2) > base);
  // Receive buffers alone: world * maxT * (row + ids + weights) bytes.
  CHECK(base >= 2u * 4u * (16u * 2u + 2u * 8u));
}

TEST_CASE("upper limits: each refused with the argument, the limit and the value", "[params][limits]") {
  expect_rejected([](auto& p) { p.num_experts = INT32_MAX; }, "params->num_experts", "<= 65536", "2147483647");
  expect_rejected([](auto& p) { p.num_experts = 65538; }, "params->num_experts", "<= 65536", "65538");
  expect_rejected(
      [](auto& p) {
        p.num_experts = 256;
        p.top_k = 129;
      },
      "params->top_k", "<= 128", "129");
  expect_rejected([](auto& p) { p.max_tokens_per_rank = (1 << 20) + 1; }, "params->max_tokens_per_rank", "<= 1048576",
                  "1048577");
  expect_rejected([](auto& p) { p.hidden_size = 65537; }, "params->hidden_size", "<= 65536", "65537");
  expect_rejected([](auto& p) { p.hidden_row_elems = 65537; }, "params->hidden_row_elems", "<= 65536", "65537");
  expect_rejected([](auto& p) { p.scale_row_elems = 65537; }, "params->scale_row_elems", "<= 65536", "65537");
  // The limits themselves are accepted.
  CHECK(try_params([](auto& p) {
          p.num_experts = 65536;
          p.top_k = 128;
        }).first == MOE_EP_SUCCESS);
  CHECK(try_params([](auto& p) { p.max_tokens_per_rank = 1 << 20; }).first == MOE_EP_SUCCESS);
  CHECK(try_params([](auto& p) {
          p.hidden_size = 65536;
          p.scale_row_elems = 65536;
        }).first == MOE_EP_SUCCESS);
}

TEST_CASE("upper limits: the per-rank workspace is at most 1 TiB", "[params][limits]") {
  auto bf16_rows = [](moe_ep_params_t& p) {
    p.num_experts = 64;
    p.max_tokens_per_rank = 1 << 20;
    p.hidden_size = 16384;
  };
  // 8 ranks x 2^20 rows of 32 KiB payload + 64 KiB combine rows: about 0.8 TiB.
  CHECK(try_params(bf16_rows, 8).first == MOE_EP_SUCCESS);
  // 16 ranks: about 1.6 TiB.
  expect_rejected(bf16_rows, "params", "up to 1099511627776 bytes per rank", "", 16);
  const auto [status, message] = try_params(bf16_rows, 16);
  CHECK(status == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(message, Contains("world_size 16") && Contains("max_tokens_per_rank 1048576") && Contains(" bytes"));
}

TEST_CASE("upper limits: create refuses them at once", "[params][limits]") {
  const moe_ep_bootstrap_t b = moe_ep_test::single_rank_bootstrap();
  const moe_ep_config_t c = moe_ep_test::host_config();
  const auto start = std::chrono::steady_clock::now();
  moe_ep_params_t p = valid_params();
  p.num_experts = INT32_MAX;  // once: an 8.6 GB workspace and a minute-long create
  moe_ep_handle_t h = nullptr;
  CHECK(moe_ep_create(&b, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(h == nullptr);
  CHECK_THAT(moe_ep_last_error(),
             Contains("params->num_experts") && Contains("<= 65536") && Contains("got 2147483647"));
  p = valid_params();
  p.hidden_size = 1 << 30;
  CHECK(moe_ep_create(&b, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("params->hidden_size") && Contains("<= 65536"));
  p = valid_params();
  p.num_experts = 64;
  p.max_tokens_per_rank = 1 << 20;
  p.hidden_size = 65536;
  p.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 64, 1};
  p.scale_row_elems = 65536;
  p.scale_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 64, 1};
  p.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};
  CHECK(moe_ep_create(&b, &p, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);  // ~1.75 TiB on one rank
  CHECK_THAT(moe_ep_last_error(), Contains("bytes per rank"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}
