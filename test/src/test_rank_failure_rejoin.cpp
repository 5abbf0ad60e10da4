// Rejoin's checks (failure_policy MASK, HOST; docs/api.md, "Surviving a dead
// rank"), ranks as threads and the store in this process: a rank that leaves
// is masked by the survivors within timeout_ms; a replacement that asks to
// rejoin while its rank is still active is refused; one with other
// parameters is refused on both sides, naming the field, and the group stays
// usable; the right one is admitted and the full group matches the oracle.
// The fork-based tests (test_rank_failure.cpp) kill real processes.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "host_case_runner.hpp"
#include "loopback_store.hpp"
#include "masked_round.hpp"
#include "moe_ep_c.h"
#include "rank_checks.hpp"
#include "rank_pair.hpp"

using namespace moe_ep_test;
using Catch::Matchers::Contains;

namespace {

moe_ep_verify::WorkloadSpec spec3() {
  moe_ep_verify::WorkloadSpec w;
  w.world = 3;
  w.num_experts = 6;
  w.top_k = 2;
  w.max_tokens_per_rank = 5;
  w.hidden_size = 8;
  w.seed = 77;
  return w;
}

void wait_for(const std::atomic<int>& counter, int value) {
  while (counter.load() < value) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Runs body(r, h, checks) on three rank threads, each with a handle of `w`
// and `config` over a bootstrap from the store at `address` (`boot_prefix`);
// the body may destroy h or replace it.  Then asserts what the ranks recorded.
template <class Body>
void run_group(const std::string& address, const char* boot_prefix, const moe_ep_config_t& config,
               const moe_ep_verify::WorkloadSpec& w, const Body& body) {
  RankChecks checks;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      moe_ep_bootstrap_t b;
      moe_ep_bootstrap_init(&b, sizeof b);
      RANK_REQUIRE(checks, r,
                   moe_ep_bootstrap_from_store(address.c_str(), boot_prefix, r, 3, 10000, &b) == MOE_EP_SUCCESS);
      moe_ep_params_t p = w.params();
      moe_ep_handle_t h = nullptr;
      RANK_REQUIRE(checks, r, moe_ep_create(&b, &p, &config, &h) == MOE_EP_SUCCESS);
      body(r, h, checks);
      moe_ep_destroy(&h);
      moe_ep_bootstrap_release(&b);
    });
  }
  for (auto& t : ranks) t.join();
  checks.assert_all();
}

}  // namespace

TEST_CASE("rejoin: refused while active, refused with other parameters, then admitted", "[rank_failure]") {
  const LoopbackStore store;
  REQUIRE(store.serving());
  const std::string& address = store.address();
  const moe_ep_verify::WorkloadSpec w = spec3();
  std::atomic<int> survivors_ready{0}, left{0};
  auto rejoin = [&](int hidden_size, int32_t backend = MOE_EP_BACKEND_HOST) {
    moe_ep_bootstrap_t b;
    moe_ep_bootstrap_init(&b, sizeof b);
    b.rank = 2;
    b.world_size = 3;
    moe_ep_config_t c = mask_config(address.c_str(), "rejoin_test", 1000);
    c.rejoin = 1;
    c.backend = backend;
    moe_ep_params_t p = w.params();
    p.hidden_size = hidden_size;
    moe_ep_handle_t h = nullptr;
    const moe_ep_status_t rc = moe_ep_create(&b, &p, &c, &h);
    return std::make_pair(rc, h);
  };
  const moe_ep_config_t config = mask_config(address.c_str(), "rejoin_test", 1000);
  run_group(address, "rejoin_boot", config, w, [&](int r, moe_ep_handle_t& h, RankChecks& checks) {
    MaskedRound m = run_masked_round(h, round_spec(w, 0), r);
    RANK_CHECK(checks, r, m.status == MOE_EP_SUCCESS && m.wrong == 0);
    if (r == 2) {
      // Still active: a replacement for this rank is refused.
      const auto early = rejoin(w.hidden_size);
      RANK_CHECK(checks, r, early.first == MOE_EP_ERROR_INVALID_STATE);
      RANK_CHECK(checks, r, std::string(moe_ep_last_error()).find("still active") != std::string::npos);
      moe_ep_destroy(&h);  // leaves: makes no more calls
      left = 1;
      wait_for(survivors_ready, 2);
      // Other parameters: refused here and on the survivors, naming the field.
      const auto wrong = rejoin(w.hidden_size + 1);
      RANK_CHECK(checks, r, wrong.first == MOE_EP_ERROR_INVALID_ARGUMENT);
      RANK_CHECK(checks, r, std::string(moe_ep_last_error()).find("params->hidden_size") != std::string::npos);
      // Another backend than the group's: refused here, before the survivors are asked.
      const auto other = rejoin(w.hidden_size, MOE_EP_BACKEND_NVLINK_TWO_SIDED);
      RANK_CHECK(checks, r, other.first == MOE_EP_ERROR_INVALID_ARGUMENT);
      RANK_CHECK(checks, r, std::string(moe_ep_last_error()).find("config->backend") != std::string::npos);
      wait_for(survivors_ready, 4);
      auto good = rejoin(w.hidden_size, MOE_EP_BACKEND_AUTO);  // AUTO: the group's backend
      RANK_CHECK(checks, r, good.first == MOE_EP_SUCCESS);
      h = good.second;
    } else {
      wait_for(left, 1);
      m = run_masked_round(h, round_spec(w, 1), r);  // rank 2 is gone: masked
      RANK_CHECK(checks, r, m.status == MOE_EP_ERROR_TIMEOUT);
      RANK_CHECK(checks, r, m.error.find("rank(s) 2 did not answer") != std::string::npos);
      const moe_ep_health_t hh = poll_health(h);
      RANK_CHECK(checks, r, hh.status == MOE_EP_SUCCESS && hh.failed_rank == 2 && hh.active_count == 2);
      m = run_masked_round(h, round_spec(w, 1), r);  // the round again, masked
      RANK_CHECK(checks, r, m.status == MOE_EP_SUCCESS && m.wrong == 0 && m.mask[2] == 0);
      const std::vector<uint8_t> all{1, 1, 1};
      ++survivors_ready;
      RANK_CHECK(checks, r, moe_ep_set_active_ranks(h, all.data(), 3) == MOE_EP_ERROR_INVALID_ARGUMENT);
      RANK_CHECK(checks, r, std::string(moe_ep_last_error()).find("params->hidden_size") != std::string::npos);
      RANK_CHECK(checks, r, poll_health(h).active_count == 2);  // unchanged, usable
      ++survivors_ready;
      wait_for(survivors_ready, 4);
      RANK_CHECK(checks, r, moe_ep_set_active_ranks(h, all.data(), 3) == MOE_EP_SUCCESS);
    }
    RANK_REQUIRE(checks, r, h != nullptr);
    for (int round = 2; round < 5; ++round) {
      m = run_masked_round(h, round_spec(w, round), r);
      RANK_CHECK(checks, r, m.status == MOE_EP_SUCCESS && m.wrong == 0 && m.mask == std::vector<uint8_t>(3, 1));
    }
    const moe_ep_health_t hh = poll_health(h);
    RANK_CHECK(checks, r, hh.active_count == 3 && hh.mask_epoch == 2);
  });
}

TEST_CASE("rank failure: every pair in flight ends, then the next round runs masked", "[rank_failure]") {
  const LoopbackStore store;
  REQUIRE(store.serving());
  const std::string& address = store.address();
  const moe_ep_verify::WorkloadSpec w = spec3();
  std::atomic<int> left{0};
  moe_ep_config_t config = mask_config(address.c_str(), "inflight", 500);
  config.micro_batches = 2;
  run_group(address, "inflight_boot", config, w, [&](int r, moe_ep_handle_t& h, RankChecks& checks) {
    RankPair pair(w, r);
    moe_ep_dispatch_result_t dr;
    moe_ep_dispatch_result_init(&dr, sizeof dr);
    // Slot 0 dispatched on every rank; then rank 2 leaves.
    RANK_REQUIRE(checks, r, moe_ep_dispatch_send(h, 0, pair.args.get(), nullptr) == MOE_EP_SUCCESS);
    RANK_REQUIRE(checks, r, moe_ep_dispatch_recv(h, 0, &dr, nullptr) == MOE_EP_SUCCESS);
    if (r == 2) {
      moe_ep_destroy(&h);
      left = 1;
      return;
    }
    wait_for(left, 1);
    // Slot 1's send finds rank 2 missing: TIMEOUT, usable, and slot 0's pair is over too.
    RANK_CHECK(checks, r, moe_ep_dispatch_send(h, 1, pair.args.get(), nullptr) == MOE_EP_ERROR_TIMEOUT);
    RANK_CHECK(checks, r, poll_health(h).status == MOE_EP_SUCCESS && poll_health(h).failed_rank == 2);
    RANK_CHECK(checks, r, moe_ep_combine_send(h, 0, pair.eo.get(), nullptr) == MOE_EP_ERROR_INVALID_STATE);
    RANK_CHECK(checks, r, std::string(moe_ep_last_error()).find("IDLE") != std::string::npos);
    for (int round = 1; round < 4; ++round) {
      const MaskedRound m = run_masked_round(h, round_spec(w, round), r);
      RANK_CHECK(checks, r, m.status == MOE_EP_SUCCESS && m.wrong == 0 && m.mask == std::vector<uint8_t>({1, 1, 0}));
    }
  });
}
