// The collective-failure pattern, written once: a rank does some work of its
// own, then every rank learns whether every rank succeeded.  A failure on one
// rank (of any exception type) thus fails the step on every rank, with the
// failing rank's message, instead of leaving the others waiting in the next
// collective call.
#pragma once

#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "bootstrap.hpp"
#include "error.hpp"

namespace moe_ep {

// The status and message of the exception being handled (call inside a
// catch block): a moe_ep::Error keeps its own, running out of host memory is
// OUT_OF_MEMORY, anything else INTERNAL.
inline moe_ep_status_t status_of_current_exception(std::string* message) {
  try {
    throw;
  } catch (const Error& e) {
    *message = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    *message = "out of host memory";
    return MOE_EP_ERROR_OUT_OF_MEMORY;
  } catch (const std::length_error&) {  // a container asked for more than it can hold
    *message = "out of host memory (a buffer too large to allocate)";
    return MOE_EP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    *message = std::string("internal error: ") + e.what();
    return MOE_EP_ERROR_INTERNAL;
  } catch (...) {
    *message = "internal error: unknown exception";
    return MOE_EP_ERROR_INTERNAL;
  }
}

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
