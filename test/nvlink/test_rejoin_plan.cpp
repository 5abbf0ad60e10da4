// What the ranks of an NVLINK_TWO_SIDED group decide when a rank comes back
// into the mask (nvlink/rejoin_plan.hpp): who exchanges memory with whom, and
// the settings check every participant runs alike.  Ranks are threads.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "error.hpp"
#include "nvlink/rejoin_plan.hpp"
#include "thread_bootstrap.hpp"

namespace {

struct Outcome {
  int32_t group_min = -1;
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string error;
};

// Three ranks, rank 2 joining; `settings(rank)` is what each brings.
std::vector<Outcome> agree(const std::function<moe_ep::RejoinSettings(int rank)>& settings) {
  std::vector<Outcome> out(3);
  const moe_ep::HandlePeers peers = moe_ep::rejoin_peers({1, 1, 0}, {1, 1, 1});
  moe_ep_test::run_ranks(3, [&](int rank, const moe_ep_bootstrap_t& b) {
    const moe_ep::Bootstrap bootstrap(&b);
    try {
      out[rank].group_min = moe_ep::agree_on_rejoin_settings(bootstrap, peers, settings(rank));
    } catch (const moe_ep::Error& e) {
      out[rank].status = e.status();
      out[rank].error = e.what();
    }
  });
  return out;
}

moe_ep::RejoinSettings member(int32_t group_min) {
  moe_ep::RejoinSettings s;
  s.combine_schedule = 2;
  s.group_min_sm_budget = group_min;
  s.sm_budget = 132;
  return s;
}

}  // namespace

TEST_CASE("rejoin plan: the ranks active after the change take part, the ones new to it join", "[rejoin]") {
  const moe_ep::HandlePeers p = moe_ep::rejoin_peers({1, 0, 1, 0}, {1, 1, 1, 0});
  CHECK(p.participants == std::vector<uint8_t>{1, 1, 1, 0});
  CHECK(p.joining == std::vector<uint8_t>{0, 1, 0, 0});
  CHECK(moe_ep::any_joining(p));
  CHECK(p.wants(1, 0));
  CHECK(p.wants(2, 1));
  CHECK_FALSE(p.wants(0, 2));
  CHECK_FALSE(p.wants(3, 1));
  CHECK_FALSE(moe_ep::any_joining(moe_ep::rejoin_peers({1, 1, 0}, {1, 0, 0})));  // a rank leaving only
}

TEST_CASE("rejoin plan: the group's smallest SM budget stays, and every participant learns it", "[rejoin]") {
  const auto out = agree([](int rank) {
    moe_ep::RejoinSettings s = member(24);
    if (rank == 2) {  // the newcomer: its own budget, no group minimum yet
      s.group_min_sm_budget = 0;
      s.sm_budget = 40;
    }
    return s;
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << out[r].error);
    CHECK(out[r].status == MOE_EP_SUCCESS);
    CHECK(out[r].group_min == 24);
  }
}

TEST_CASE("rejoin plan: a newcomer below the group's smallest SM budget is refused on every participant", "[rejoin]") {
  const auto out = agree([](int rank) {
    moe_ep::RejoinSettings s = member(24);
    if (rank == 2) s.sm_budget = 16;
    return s;
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << out[r].error);
    CHECK(out[r].status == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(out[r].error.find("config->num_sms: rank 2 would rejoin with 16 SMs") != std::string::npos);
  }
}

TEST_CASE("rejoin plan: another combine schedule, or members that disagree, fail every participant", "[rejoin]") {
  auto schedule = agree([](int rank) {
    moe_ep::RejoinSettings s = member(24);
    if (rank == 2) s.combine_schedule = 1;
    return s;
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << schedule[r].error);
    CHECK(schedule[r].status == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(schedule[r].error.find("MOE_EP_COMBINE_SCHEDULE") != std::string::npos);
  }
  auto members = agree([](int rank) { return member(rank == 1 ? 32 : 24); });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << members[r].error);
    CHECK(members[r].status == MOE_EP_ERROR_INVALID_INPUT);
    CHECK(members[r].error.find("rank 1 holds 32") != std::string::npos);
  }
}
