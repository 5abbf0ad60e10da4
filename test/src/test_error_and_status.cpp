// Status strings, the thread-local last error, the version query, and which
// statuses leave a handle broken.
#include <catch2/catch.hpp>

#include <string>
#include <thread>

#include "handle_health.hpp"
#include "moe_ep_c.h"

TEST_CASE("every status has its own name", "[status]") {
  const moe_ep_status_t all[] = {MOE_EP_SUCCESS, MOE_EP_ERROR_INVALID_ARGUMENT, MOE_EP_ERROR_UNSUPPORTED,
                                 MOE_EP_ERROR_CUDA, MOE_EP_ERROR_BOOTSTRAP, MOE_EP_ERROR_OUT_OF_MEMORY,
                                 MOE_EP_ERROR_TIMEOUT, MOE_EP_ERROR_INVALID_STATE, MOE_EP_ERROR_INVALID_INPUT,
                                 MOE_EP_ERROR_INTERNAL};
  for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); ++i) {
    for (size_t j = i + 1; j < sizeof(all) / sizeof(all[0]); ++j) {
      CHECK(std::string(moe_ep_status_string(all[i])) != moe_ep_status_string(all[j]));
    }
  }
  CHECK(std::string(moe_ep_status_string(MOE_EP_ERROR_TIMEOUT)) == "MOE_EP_ERROR_TIMEOUT");
  CHECK(std::string(moe_ep_status_string(12345)) == "MOE_EP_ERROR_UNKNOWN");
  CHECK(std::string(moe_ep_status_string(MOE_EP_ERROR_INVALID_INPUT)) == "MOE_EP_ERROR_INVALID_INPUT");
}

TEST_CASE("the last error is per thread and cleared by a successful call", "[status]") {
  REQUIRE(moe_ep_params_init(nullptr, sizeof(moe_ep_params_t)) == MOE_EP_ERROR_INVALID_ARGUMENT);
  const std::string mine = moe_ep_last_error();
  CHECK(mine.find("params") != std::string::npos);
  CHECK(mine.find("NULL") != std::string::npos);

  std::string other;
  std::thread([&] { other = moe_ep_last_error(); }).join();
  CHECK(other.empty());
  CHECK(std::string(moe_ep_last_error()) == mine);  // another thread did not clear ours

  moe_ep_params_t p;
  REQUIRE(moe_ep_params_init(&p, sizeof p) == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()).empty());
}

TEST_CASE("version query matches the header and accepts NULL", "[status]") {
  int32_t major = -1, minor = -1, patch = -1;
  REQUIRE(moe_ep_get_version(&major, &minor, &patch) == MOE_EP_SUCCESS);
  CHECK(major == MOE_EP_VERSION_MAJOR);
  CHECK(minor == MOE_EP_VERSION_MINOR);
  CHECK(patch == MOE_EP_VERSION_PATCH);
  CHECK(moe_ep_get_version(nullptr, nullptr, nullptr) == MOE_EP_SUCCESS);
}

TEST_CASE("set_last_error sets and clears this thread's message", "[status]") {
  CHECK(moe_ep_set_last_error("from a callback") == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()) == "from a callback");
  std::string other = "unset";
  std::thread([&] { other = moe_ep_last_error(); }).join();
  CHECK(other.empty());
  CHECK(moe_ep_set_last_error(nullptr) == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()).empty());
}

TEST_CASE("HandleHealth: TIMEOUT, CUDA_ERROR and INTERNAL are sticky; the first one is kept", "[error]") {
  for (moe_ep_status_t s : {MOE_EP_ERROR_TIMEOUT, MOE_EP_ERROR_CUDA, MOE_EP_ERROR_INTERNAL}) {
    CHECK(moe_ep::HandleHealth::is_sticky(s));
  }
  for (moe_ep_status_t s :
       {MOE_EP_SUCCESS, MOE_EP_ERROR_INVALID_ARGUMENT, MOE_EP_ERROR_INVALID_STATE, MOE_EP_ERROR_INVALID_INPUT,
        MOE_EP_ERROR_UNSUPPORTED, MOE_EP_ERROR_OUT_OF_MEMORY, MOE_EP_ERROR_BOOTSTRAP}) {
    CHECK_FALSE(moe_ep::HandleHealth::is_sticky(s));
  }
  moe_ep::HandleHealth health;
  // A non-sticky failure of a call goes to the caller and leaves the handle usable.
  CHECK_THROWS_AS(health.guard([] { moe_ep::fail(MOE_EP_ERROR_INVALID_ARGUMENT, "bad"); }), moe_ep::Error);
  CHECK_FALSE(health.broken());
  CHECK(health.guard([] { return 7; }) == 7);
  // A sticky one breaks it; later calls are refused with it, not run.
  CHECK_THROWS_AS(health.guard([] { moe_ep::fail(MOE_EP_ERROR_TIMEOUT, "peer 1 stalled"); }), moe_ep::Error);
  REQUIRE(health.broken());
  health.record(MOE_EP_ERROR_CUDA, "later");  // the first failure stays
  CHECK(health.status() == MOE_EP_ERROR_TIMEOUT);
  CHECK(health.message() == "peer 1 stalled");
  bool ran = false;
  try {
    health.guard([&] { ran = true; });
    FAIL("a broken handle ran a call");
  } catch (const moe_ep::Error& e) {
    CHECK(e.status() == MOE_EP_ERROR_TIMEOUT);
    CHECK(std::string(e.what()) == "peer 1 stalled");
  }
  CHECK_FALSE(ran);
}
