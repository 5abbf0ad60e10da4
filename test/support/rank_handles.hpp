// Per-rank handles for tests of one call sequence on every rank (ranks as
// threads): each rank creates its own handle of the same workload and
// configuration, runs the test's body on it, and destroys it; the test's
// thread then asserts what the ranks recorded.
#pragma once

#include "moe_ep_c.h"
#include "rank_checks.hpp"
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

}  // namespace moe_ep_test
