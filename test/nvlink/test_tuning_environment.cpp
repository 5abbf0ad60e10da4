// The NVLink backend's per-rank tuning switches: what each environment value
// turns into (defaults, clamping, rounding), read as create reads them.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "gpu/environment.hpp"
#include "nvlink/tuning_environment.hpp"
#include "scoped_environment.hpp"

namespace {

using moe_ep_test::ScopedEnvironment;

int32_t copy_bytes(const char* value) {
  const ScopedEnvironment v("MOE_EP_PULL_COPY_BYTES", value);
  return moe_ep::pull_copy_bytes_from_environment();
}

int32_t producers(const char* value) {
  const ScopedEnvironment v("MOE_EP_PULL_PRODUCERS", value);
  return moe_ep::pull_producers_from_environment();
}

int32_t small_dispatch_tokens(const char* value) {
  const ScopedEnvironment v("MOE_EP_SMALL_DISPATCH_TOKENS", value);
  return moe_ep::small_dispatch_tokens_from_environment();
}

int32_t small_combine_tokens(const char* value) {
  const ScopedEnvironment v("MOE_EP_SMALL_COMBINE_TOKENS", value);
  return moe_ep::small_combine_tokens_from_environment();
}

bool bulk(const char* value, int32_t sm_budget) {
  const ScopedEnvironment v("MOE_EP_DISPATCH_BULK", value);
  return moe_ep::dispatch_bulk_from_environment(sm_budget);
}

bool looks_back(const char* value, int32_t num_tokens, int32_t blocks) {
  const ScopedEnvironment v("MOE_EP_DISPATCH_LOOKBACK", value);
  return moe_ep::dispatch_looks_back(moe_ep::dispatch_lookback_from_environment(), num_tokens, blocks);
}

}  // namespace

TEST_CASE("environment_switch: on unless \"0\", or only when set to the named value", "[tuning]") {
  {
    const ScopedEnvironment v("MOE_EP_TEST_SWITCH", nullptr);
    CHECK(moe_ep::environment_switch("MOE_EP_TEST_SWITCH"));
    CHECK_FALSE(moe_ep::environment_switch("MOE_EP_TEST_SWITCH", "1"));
  }
  {
    const ScopedEnvironment v("MOE_EP_TEST_SWITCH", "0");
    CHECK_FALSE(moe_ep::environment_switch("MOE_EP_TEST_SWITCH"));
    CHECK_FALSE(moe_ep::environment_switch("MOE_EP_TEST_SWITCH", "1"));
  }
  {
    const ScopedEnvironment v("MOE_EP_TEST_SWITCH", "registers");
    CHECK(moe_ep::environment_switch("MOE_EP_TEST_SWITCH"));
    CHECK(moe_ep::environment_switch("MOE_EP_TEST_SWITCH", "registers"));
    CHECK_FALSE(moe_ep::environment_switch("MOE_EP_TEST_SWITCH", "1"));
  }
}

TEST_CASE("int_from_environment: positive integers below 65536, else 0", "[tuning]") {
  const char* name = "MOE_EP_TEST_INT";
  const struct {
    const char* value;
    int32_t expected;
  } cases[] = {{nullptr, 0}, {"", 0},        {"abc", 0},       {"-5", 0},    {"0", 0},
               {"1", 1},     {"4096", 4096}, {"65535", 65535}, {"65536", 0}, {"99999999999999999999", 0}};
  for (const auto& c : cases) {
    const ScopedEnvironment v(name, c.value);
    INFO("value " << (c.value ? c.value : "(unset)"));
    CHECK(moe_ep::int_from_environment(name) == c.expected);
  }
}

TEST_CASE("MOE_EP_PULL_COPY_BYTES: default one copy per row, multiples of 16 within 16..16384", "[tuning]") {
  CHECK(copy_bytes(nullptr) == moe_ep::kDefaultPullCopyBytes);
  CHECK(copy_bytes("0") == moe_ep::kDefaultPullCopyBytes);
  CHECK(copy_bytes("junk") == moe_ep::kDefaultPullCopyBytes);
  CHECK(copy_bytes("1") == 16);
  CHECK(copy_bytes("15") == 16);
  CHECK(copy_bytes("16") == 16);
  CHECK(copy_bytes("2050") == 2048);
  CHECK(copy_bytes("4096") == 4096);
  CHECK(copy_bytes("16384") == 16384);
  CHECK(copy_bytes("60000") == 16384);
}

TEST_CASE("MOE_EP_PULL_PRODUCERS: default 2, clamped to 1..4", "[tuning]") {
  CHECK(producers(nullptr) == moe_ep::kDefaultPullProducers);
  CHECK(producers("0") == moe_ep::kDefaultPullProducers);
  CHECK(producers("-2") == moe_ep::kDefaultPullProducers);
  CHECK(producers("1") == 1);
  CHECK(producers("2") == 2);
  CHECK(producers("3") == 3);
  CHECK(producers("4") == 4);
  CHECK(producers("9") == moe_ep::kMaxPullProducers);
}

TEST_CASE("MOE_EP_SMALL_DISPATCH_TOKENS: default, clamped to 1..512", "[tuning]") {
  CHECK(small_dispatch_tokens(nullptr) == moe_ep::kDefaultSmallDispatchTokens);
  CHECK(small_dispatch_tokens("0") == moe_ep::kDefaultSmallDispatchTokens);
  CHECK(small_dispatch_tokens("-3") == moe_ep::kDefaultSmallDispatchTokens);
  CHECK(small_dispatch_tokens("junk") == moe_ep::kDefaultSmallDispatchTokens);
  CHECK(small_dispatch_tokens("1") == 1);
  CHECK(small_dispatch_tokens("200") == 200);
  CHECK(small_dispatch_tokens("512") == 512);
  CHECK(small_dispatch_tokens("513") == moe_ep::kMaxSmallDispatchTokens);
  CHECK(moe_ep::kMaxSmallDispatchTokens == 512);
}

TEST_CASE("MOE_EP_SMALL_COMBINE_TOKENS: default, clamped to 1..512", "[tuning]") {
  CHECK(small_combine_tokens(nullptr) == moe_ep::kDefaultSmallCombineTokens);
  CHECK(small_combine_tokens("0") == moe_ep::kDefaultSmallCombineTokens);
  CHECK(small_combine_tokens("junk") == moe_ep::kDefaultSmallCombineTokens);
  CHECK(small_combine_tokens("7") == 7);
  CHECK(small_combine_tokens("512") == 512);
  CHECK(small_combine_tokens("4096") == moe_ep::kMaxSmallCombineTokens);
  CHECK(moe_ep::kMaxSmallCombineTokens == 512);
  CHECK(moe_ep::kDefaultSmallCombineTokens == 384);
}

TEST_CASE("MOE_EP_DISPATCH_BULK: 1 always, 0 never, else by the SM budget", "[tuning]") {
  const int32_t at = moe_ep::kDispatchBulkAutoMaxSms;
  for (const int32_t budget : {1, at, at + 1, 16, 132}) {
    INFO("SM budget " << budget);
    CHECK(bulk("1", budget));
    CHECK_FALSE(bulk("0", budget));
    CHECK(bulk(nullptr, budget) == (budget <= at));
    CHECK(bulk("junk", budget) == (budget <= at));
  }
}

TEST_CASE("MOE_EP_DISPATCH_LOOKBACK: 1 always, 0 never, else large calls on small grids", "[tuning]") {
  const int32_t min_tokens = moe_ep::kLookbackMinTokens, max_blocks = moe_ep::kLookbackMaxBlocks;
  for (const int32_t tokens : {0, 1, 512, min_tokens, min_tokens + 1, 4096}) {
    for (const int32_t blocks : {1, 8, max_blocks, max_blocks + 1, 132}) {
      INFO("tokens " << tokens << ", blocks " << blocks);
      const bool expected = tokens > min_tokens && blocks <= max_blocks;
      CHECK(looks_back("1", tokens, blocks));
      CHECK_FALSE(looks_back("0", tokens, blocks));
      CHECK(looks_back(nullptr, tokens, blocks) == expected);
      CHECK(looks_back("junk", tokens, blocks) == expected);
    }
  }
  // The measured crossover (v27): 4096 tokens on 8-24 SMs by look-back, on 66 by scan; 1024 by scan.
  CHECK(looks_back(nullptr, 4096, 24));
  CHECK_FALSE(looks_back(nullptr, 4096, 66));
  CHECK_FALSE(looks_back(nullptr, 1024, 16));
}
