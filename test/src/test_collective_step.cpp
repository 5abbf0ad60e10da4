// run_then_agree: whatever one rank's local work throws, every rank leaves the
// step with an error (none waits for the failed rank), the failing rank with
// its own status and message, the others naming it.
#include <catch2/catch.hpp>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "collective_step.hpp"
#include "error.hpp"
#include "thread_bootstrap.hpp"

namespace {

struct Outcome {
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
};

// Runs one step on `world` thread ranks where rank `failing` throws via `fail_with`.
template <typename Throw>
std::vector<Outcome> step_where_one_rank_throws(int world, int failing, Throw fail_with) {
  std::vector<Outcome> outcomes(world);
  moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    const moe_ep::Bootstrap bootstrap(&b);
    try {
      moe_ep::run_then_agree(bootstrap, [&] {
        if (rank == failing) fail_with();
      });
      // A second collective step: reached by nobody if the first failed everywhere.
      moe_ep::run_then_agree(bootstrap, [] {});
    } catch (const moe_ep::Error& e) {
      outcomes[rank] = Outcome{e.status(), e.what()};
    }
  });
  return outcomes;
}

}  // namespace

TEST_CASE("run_then_agree: a failure of any exception type fails the step on every rank", "[collective_step]") {
  SECTION("moe_ep::Error keeps its status and message") {
    const auto o = step_where_one_rank_throws(3, 1, [] { moe_ep::fail(MOE_EP_ERROR_UNSUPPORTED, "no such thing"); });
    CHECK(o[1].status == MOE_EP_ERROR_UNSUPPORTED);
    CHECK(o[1].message == "no such thing");
    for (int r : {0, 2}) {
      CHECK(o[r].status == MOE_EP_ERROR_UNSUPPORTED);
      CHECK(o[r].message == "rank 1 failed: no such thing");
    }
  }
  SECTION("std::bad_alloc is OUT_OF_MEMORY") {
    const auto o = step_where_one_rank_throws(2, 0, [] { throw std::bad_alloc(); });
    CHECK(o[0].status == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(o[1].status == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(o[1].message == "rank 0 failed: out of host memory");
  }
  SECTION("std::length_error (a buffer too large for a container) is OUT_OF_MEMORY") {
    const auto o = step_where_one_rank_throws(2, 1, [] { throw std::length_error("vector too long"); });
    CHECK(o[0].status == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(o[1].status == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(o[0].message == "rank 1 failed: out of host memory (a buffer too large to allocate)");
  }
  SECTION("another std::exception is INTERNAL with its text") {
    const auto o = step_where_one_rank_throws(2, 1, [] { throw std::runtime_error("no luck"); });
    CHECK(o[1].status == MOE_EP_ERROR_INTERNAL);
    CHECK(o[0].message == "rank 1 failed: internal error: no luck");
  }
  SECTION("anything else is INTERNAL") {
    const auto o = step_where_one_rank_throws(2, 1, [] { throw 42; });
    CHECK(o[0].status == MOE_EP_ERROR_INTERNAL);
    CHECK(o[1].status == MOE_EP_ERROR_INTERNAL);
    CHECK(o[1].message == "internal error: unknown exception");
  }
  SECTION("no failure: every rank passes both steps") {
    const auto o = step_where_one_rank_throws(3, -1, [] {});
    for (const Outcome& x : o) CHECK(x.status == MOE_EP_SUCCESS);
  }
}

TEST_CASE("check_same_on_every_rank: one exchange, the first differing value named on every rank",
          "[collective_step]") {
  const auto run = [](int world, int odd_rank, int odd_field) {
    std::vector<Outcome> outcomes(world);
    moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
      const moe_ep::Bootstrap bootstrap(&b);
      std::vector<moe_ep::RankValue> mine = {{"params->top_k", 2}, {"config->timeout_ms", 1000}};
      if (rank == odd_rank) mine[odd_field].value += 5;
      try {
        moe_ep::check_same_on_every_rank(bootstrap, mine, "test check");
      } catch (const moe_ep::Error& e) {
        outcomes[rank] = Outcome{e.status(), e.what()};
      }
    });
    return outcomes;
  };
  SECTION("the same values everywhere pass") {
    for (const Outcome& o : run(3, -1, 0)) CHECK(o.status == MOE_EP_SUCCESS);
  }
  SECTION("a value that differs on one rank fails every rank alike") {
    for (const Outcome& o : run(3, 2, 1)) {
      CHECK(o.status == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK(o.message ==
            "config->timeout_ms: expected the same value on every rank, got 1000 on rank 0 and 1005 on "
            "rank 2");
    }
  }
}
