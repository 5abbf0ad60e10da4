// Versioned structs (docs/semantics.md §3): older, smaller structs get defaults for their
// missing tail; newer, larger ones are accepted only with a zero tail; output
// structs are written up to the caller's size only.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "params.hpp"
#include "test_params.hpp"
#include "versioned_struct.hpp"

using Catch::Matchers::Contains;

namespace {
moe_ep_params_t valid_params() { return moe_ep_test::make_params(8, 2, 4, 16); }
}  // namespace

TEST_CASE("init functions fill struct_size and documented defaults", "[versioning]") {
  moe_ep_params_t p;
  std::memset(&p, 0xAB, sizeof(p));
  REQUIRE(moe_ep_params_init(&p) == MOE_EP_SUCCESS);
  CHECK(p.struct_size == sizeof(p));
  CHECK(p.invalid_expert_id == -1);
  CHECK(p.hidden_dtype.code == MOE_EP_DTYPE_BFLOAT);
  CHECK(p.hidden_dtype.bits == 16);
  CHECK(p.scale_dtype.code == MOE_EP_DTYPE_FLOAT);
  CHECK(p.combine_dtype.code == MOE_EP_DTYPE_BFLOAT);
  CHECK(p.enable_eplb_stats == 0);
  CHECK(p.num_experts == 0);

  moe_ep_config_t c;
  REQUIRE(moe_ep_config_init(&c) == MOE_EP_SUCCESS);
  CHECK(c.struct_size == sizeof(c));
  CHECK(c.backend == MOE_EP_BACKEND_AUTO);
  CHECK(c.num_sms == 0);
  CHECK(c.timeout_ms == 30000);
  CHECK(c.device == -1);

  moe_ep_bootstrap_t b;
  REQUIRE(moe_ep_bootstrap_init(&b) == MOE_EP_SUCCESS);
  CHECK(b.struct_size == sizeof(b));
  CHECK(b.allgather == nullptr);
  moe_ep_dispatch_args_t a;
  REQUIRE(moe_ep_dispatch_args_init(&a) == MOE_EP_SUCCESS);
  CHECK(a.struct_size == sizeof(a));
  CHECK(a.runtime_max_tokens_per_rank == 0);
  moe_ep_dispatch_result_t r;
  REQUIRE(moe_ep_dispatch_result_init(&r) == MOE_EP_SUCCESS);
  CHECK(r.struct_size == sizeof(r));
  moe_ep_combine_result_t cr;
  REQUIRE(moe_ep_combine_result_init(&cr) == MOE_EP_SUCCESS);
  CHECK(cr.struct_size == sizeof(cr));
}

TEST_CASE("an older, smaller params struct gets defaults for its missing tail", "[versioning]") {
  moe_ep_params_t p = valid_params();
  p.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};  // beyond the old size: must be ignored
  p.invalid_expert_id = -7;                                     // inside the old size: kept
  p.struct_size = offsetof(moe_ep_params_t, enable_eplb_stats);
  const moe_ep_params_t merged = moe_ep::read_params(&p);
  CHECK(merged.struct_size == sizeof(moe_ep_params_t));
  CHECK(merged.invalid_expert_id == -7);
  CHECK(merged.enable_eplb_stats == 0);
  CHECK(merged.combine_dtype.code == MOE_EP_DTYPE_BFLOAT);  // the default, not the stale tail
}

TEST_CASE("a newer, larger struct is accepted only if its unknown tail is zero", "[versioning]") {
  struct Bigger {
    moe_ep_params_t known;
    int32_t future[4];
  } big{};
  big.known = valid_params();
  big.known.struct_size = sizeof(big);
  const moe_ep_params_t merged = moe_ep::read_params(&big.known);
  CHECK(merged.num_experts == 8);

  big.future[2] = 1;
  try {
    moe_ep::read_params(&big.known);
    FAIL("expected an error");
  } catch (const moe_ep::Error& e) {
    CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(e.what(), Contains("params") && Contains("newer header") && Contains("offset"));
  }
}

TEST_CASE("a struct_size below the minimum is rejected with a hint", "[versioning]") {
  moe_ep_params_t p = valid_params();
  p.struct_size = 4;
  try {
    moe_ep::read_params(&p);
    FAIL("expected an error");
  } catch (const moe_ep::Error& e) {
    CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(e.what(), Contains("params->struct_size") && Contains("got 4") && Contains("_init"));
  }
}

namespace {

// Every size from 0 to the cap: accepted exactly on the listed boundaries,
// and above sizeof(T) on multiples of the alignment up to the cap.
template <typename T>
void check_size_rule() {
  using L = moe_ep::StructLayout<T>;
  INFO(L::c_name);
  std::vector<bool> boundary(sizeof(T) + 1, false);
  for (size_t end : L::field_ends) boundary.at(end) = true;
  boundary.at(sizeof(T)) = true;
  CHECK(std::string(L::c_name).find("moe_ep_") == 0);
  for (uint32_t size = 0; size <= moe_ep::kMaxStructSize + 16; ++size) {
    const bool expected = size <= sizeof(T) ? static_cast<bool>(boundary[size])
                                            : size <= moe_ep::kMaxStructSize && size % alignof(T) == 0;
    INFO("struct_size " << size);
    CHECK(moe_ep::is_valid_struct_size<T>(size) == expected);
  }
  CHECK_FALSE(moe_ep::is_valid_struct_size<T>(0xFFFFFFFFu));
  CHECK_FALSE(moe_ep::is_valid_struct_size<T>(4));  // struct_size alone: no field
}

}  // namespace

TEST_CASE("struct_size must end on a field boundary of a released layout", "[versioning]") {
  check_size_rule<moe_ep_bootstrap_t>();
  check_size_rule<moe_ep_params_t>();
  check_size_rule<moe_ep_config_t>();
  check_size_rule<moe_ep_dispatch_args_t>();
  check_size_rule<moe_ep_dispatch_result_t>();
  check_size_rule<moe_ep_combine_result_t>();
  // Spot checks of the rule against the 0.1 layouts (64-bit pointers).
  CHECK(moe_ep::is_valid_struct_size<moe_ep_dispatch_args_t>(16));   // ends after hidden_states
  CHECK_FALSE(moe_ep::is_valid_struct_size<moe_ep_dispatch_args_t>(12));  // cuts hidden_states
  CHECK_FALSE(moe_ep::is_valid_struct_size<moe_ep_dispatch_args_t>(8));   // padding only
  CHECK(moe_ep::is_valid_struct_size<moe_ep_bootstrap_t>(12));       // ends after world_size
  CHECK_FALSE(moe_ep::is_valid_struct_size<moe_ep_bootstrap_t>(16)); // padding before ctx
}

TEST_CASE("hostile struct_size values are INVALID_ARGUMENT naming the struct", "[versioning]") {
  SECTION("args.struct_size = 12 cuts the hidden_states pointer") {
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a);
    a.struct_size = 12;
    moe_ep_dispatch_args_t defaults{};
    try {
      moe_ep::read_versioned(&a, defaults, "args");
      FAIL("expected an error");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(e.what(), Contains("args->struct_size") && Contains("moe_ep_dispatch_args_t") &&
                               Contains("16, 24") && Contains("got 12"));
    }
  }
  SECTION("0xFFFFFFFF is never read") {
    moe_ep_params_t p = valid_params();
    p.struct_size = 0xFFFFFFFFu;
    try {
      moe_ep::read_params(&p);
      FAIL("expected an error");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(e.what(), Contains("params->struct_size") && Contains("moe_ep_params_t") &&
                               Contains("1024") && Contains("got 4294967295"));
    }
  }
  SECTION("a newer size that is not a multiple of the alignment") {
    struct Bigger {
      moe_ep_config_t known;
      int32_t future[4];
    } big{};
    moe_ep_config_init(&big.known);
    big.known.struct_size = sizeof(moe_ep_config_t) + 2;
    CHECK_THROWS_AS(moe_ep::read_config(&big.known), moe_ep::Error);
    big.known.struct_size = sizeof(moe_ep_config_t) + 4;  // one more int32: fine
    CHECK(moe_ep::read_config(&big.known).timeout_ms == 30000);
  }
}

TEST_CASE("an older config gets defaults for every field past its size", "[versioning]") {
  moe_ep_config_t c;
  moe_ep_config_init(&c);
  c.backend = MOE_EP_BACKEND_HOST;
  c.num_sms = 7;
  c.timeout_ms = -5;  // beyond the old size: must be ignored
  c.device = -9;
  c.struct_size = offsetof(moe_ep_config_t, timeout_ms);  // ends after num_sms
  const moe_ep_config_t merged = moe_ep::read_config(&c);
  CHECK(merged.backend == MOE_EP_BACKEND_HOST);
  CHECK(merged.num_sms == 7);
  CHECK(merged.timeout_ms == 30000);
  CHECK(merged.device == -1);
}

TEST_CASE("output structs are written up to the caller's struct_size only", "[versioning]") {
  moe_ep_dispatch_result_t value;
  moe_ep_dispatch_result_init(&value);
  value.tokens_per_rank = 11;
  value.hidden_states.ndim = 2;
  value.topk_ids.ndim = 2;

  SECTION("an older caller: its tail is never touched") {
    moe_ep_dispatch_result_t user;
    std::memset(&user, 0x5A, sizeof(user));
    user.struct_size = offsetof(moe_ep_dispatch_result_t, topk_ids);  // knows tokens_per_rank, hidden_states
    moe_ep::write_versioned(&user, value, "result");
    CHECK(user.struct_size == offsetof(moe_ep_dispatch_result_t, topk_ids));  // untouched
    CHECK(user.tokens_per_rank == 11);
    CHECK(user.hidden_states.ndim == 2);
    const auto* bytes = reinterpret_cast<const unsigned char*>(&user);
    for (size_t i = offsetof(moe_ep_dispatch_result_t, topk_ids); i < sizeof(user); ++i) {
      INFO("byte " << i);
      CHECK(bytes[i] == 0x5A);
    }
  }
  SECTION("a newer caller: the bytes this library does not know read as zero (absent)") {
    struct Bigger {
      moe_ep_combine_result_t known;
      unsigned char future[48];
    } big;
    std::memset(&big, 0x5A, sizeof(big));
    big.known.struct_size = sizeof(big);
    moe_ep_combine_result_t out;
    moe_ep_combine_result_init(&out);
    out.output.ndim = 2;
    moe_ep::write_versioned(&big.known, out, "result");
    CHECK(big.known.output.ndim == 2);
    for (unsigned char b : big.future) CHECK(b == 0);
  }
  SECTION("a size that cuts a field is rejected before anything is written") {
    moe_ep_combine_result_t user;
    std::memset(&user, 0x5A, sizeof(user));
    user.struct_size = 12;  // inside the output tensor's data pointer
    CHECK_THROWS_AS(moe_ep::write_versioned(&user, moe_ep_combine_result_t{}, "result"), moe_ep::Error);
    CHECK(user.output.ndim == 0x5A5A5A5A);
  }
}
