// Versioned structs (SPEC §3): older, smaller structs get defaults for their
// missing tail; newer, larger ones are accepted only with a zero tail; output
// structs are written up to the caller's size only.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstring>
#include <string>

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

TEST_CASE("output structs are written up to the caller's struct_size only", "[versioning]") {
  struct Out {
    uint32_t struct_size;
    int32_t a;
    int32_t b;
  };
  Out value{sizeof(Out), 11, 22};
  Out user;
  std::memset(&user, 0x5A, sizeof(user));
  user.struct_size = offsetof(Out, b);  // an older caller that knows only `a`
  moe_ep::write_versioned(&user, value, "result");
  CHECK(user.struct_size == offsetof(Out, b));  // untouched
  CHECK(user.a == 11);
  int32_t untouched;
  std::memset(&untouched, 0x5A, sizeof(untouched));
  CHECK(user.b == untouched);
}
