// Per-rank handles, ranks as threads: each rank creates its own handle, runs
// the test's body on it (or only records what create answered), and destroys
// it; the test's thread then asserts what the ranks recorded.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "rank_checks.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"
#include "workload.hpp"

namespace moe_ep_test {

// body(rank, h, checks) on w.world rank threads.  A rank whose create fails
// records it (as a RANK_REQUIRE) and runs no body.
template <class Body>
void with_rank_handles(const moe_ep_verify::WorkloadSpec& w, const moe_ep_config_t& config, const Body& body) {
  RankChecks checks;
  run_ranks(w.world, [&](int rank, const moe_ep_bootstrap_t& b) {
    const moe_ep_params_t p = w.params();
    moe_ep_handle_t h = nullptr;
    RANK_REQUIRE(checks, rank, moe_ep_create(&b, &p, &config, &h) == MOE_EP_SUCCESS);
    body(rank, h, checks);
    moe_ep_destroy(&h);
  });
  checks.assert_all();
}

// What moe_ep_create answered on each rank.
struct CreateOutcomes {
  std::vector<moe_ep_status_t> status;
  std::vector<std::string> messages;  // moe_ep_last_error() right after
};

// Every one of `world` rank threads creates a handle (destroyed at once) with
// the arguments args_of(rank, params, config) leaves, starting from
// moe_ep_params_init's defaults and host_config().
inline CreateOutcomes create_on_ranks(
    int world, const std::function<void(int rank, moe_ep_params_t& params, moe_ep_config_t& config)>& args_of) {
  CreateOutcomes out{std::vector<moe_ep_status_t>(size_t(world), MOE_EP_SUCCESS),
                     std::vector<std::string>(size_t(world))};
  run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_params_t p;
    moe_ep_params_init(&p, sizeof p);
    moe_ep_config_t c = host_config();
    args_of(rank, p, c);
    moe_ep_handle_t h = nullptr;
    out.status[size_t(rank)] = moe_ep_create(&b, &p, &c, &h);
    out.messages[size_t(rank)] = moe_ep_last_error();
    moe_ep_destroy(&h);
  });
  return out;
}

}  // namespace moe_ep_test
