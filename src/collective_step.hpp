// The collective-failure pattern, written once: a rank does some work of its
// own, then every rank learns whether every rank succeeded.  A failure on one
// rank (of any exception type) thus fails the step on every rank, with the
// failing rank's message, instead of leaving the others waiting in the next
// collective call.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap.hpp"
#include "error.hpp"

namespace moe_ep {

// Collective.  Runs `local_work` on this rank, then Exchange::agree: if any
// rank's work threw, every rank throws (the failing rank its own error, the
// others one naming it).  Whatever local_work throws is caught, so this rank
// always takes part in the agreement.
template <typename LocalWork>
void run_then_agree(const Exchange& exchange, LocalWork&& local_work) {
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
  try {
    std::forward<LocalWork>(local_work)();
  } catch (...) {
    status = status_of_current_exception(&message);
  }
  exchange.agree(status, message);
}

// One value that every rank of the group must hold alike, and the name that
// an error gives it ("params->top_k", "MOE_EP_NCCL_DISPATCH_CHUNKS").
struct RankValue {
  const char* name;
  int32_t value;
};

// Collective: one exchange (named `step` in its errors) of every rank's
// values.  INVALID_ARGUMENT on every rank alike when one differs: "<name>:
// expected the same value on every rank, got <a> on rank 0 and <b> on rank
// <r>", for the lowest such rank and the first such value of that rank.
void check_same_on_every_rank(const Exchange& exchange, const std::vector<RankValue>& mine,
                              const char* step = "exchange");

}  // namespace moe_ep
