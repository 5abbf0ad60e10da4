// The collective-failure pattern, written once: a rank does some work of its
// own, then every rank learns whether every rank succeeded.  A failure on one
// rank (of any exception type) thus fails the step on every rank, with the
// failing rank's message, instead of leaving the others waiting in the next
// collective call.
#pragma once

#include <string>
#include <utility>

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

}  // namespace moe_ep
