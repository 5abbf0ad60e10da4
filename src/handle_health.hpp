// Whether a handle can still be used: the one owner of the broken state.
//
// A status is sticky when, after it, the group may be out of step or the
// device state is unknown: TIMEOUT (a peer did not arrive, or an exchange was
// abandoned), CUDA_ERROR, and INTERNAL (the library lost track of its own
// state).  The first sticky failure is recorded with its message, wherever it
// was found (a dispatch, a combine, or moe_ep_get_async_error); from then on
// every dispatch, combine and asynchronous-error query of the handle fails
// with that status and message.  destroy still completes.  Any other status
// (INVALID_ARGUMENT, INVALID_STATE, INVALID_INPUT, ...) leaves the handle usable,
// and so does a TIMEOUT that the survivors turned into a mask (RankFailure,
// config->failure_policy MASK).
#pragma once

#include <string>

#include "error.hpp"
#include "moe_ep_c.h"
#include "store/rank_failure.hpp"

namespace moe_ep {

class HandleHealth {
 public:
  static bool is_sticky(moe_ep_status_t status) noexcept {
    return status == MOE_EP_ERROR_TIMEOUT || status == MOE_EP_ERROR_CUDA || status == MOE_EP_ERROR_INTERNAL;
  }

  bool broken() const noexcept { return status_ != MOE_EP_SUCCESS; }
  moe_ep_status_t status() const noexcept { return status_; }
  // The peer the recorded failure named (a timeout the device watch found), -1 if none.
  int32_t failed_rank() const noexcept { return failed_rank_; }
  const std::string& message() const noexcept { return message_; }

  // Throws the recorded failure, if any.
  void check() const {
    if (broken()) throw Error(status_, message_);
  }

  // Keeps the first sticky failure; any other status, or a later failure, is ignored.
  void record(moe_ep_status_t status, const std::string& message, int32_t failed_rank = -1) noexcept {
    if (broken() || !is_sticky(status)) return;
    status_ = status;
    failed_rank_ = failed_rank;
    try {
      message_ = message;
    } catch (...) {  // out of memory copying the message: the status alone
      message_.clear();
    }
  }

  // Runs a call on the handle: refused if the handle is broken; a sticky
  // failure of the call breaks it, and the exception goes on to the caller.
  template <typename Call>
  decltype(auto) guard(Call&& call) {
    check();
    try {
      return call();
    } catch (const RankFailure&) {
      throw;  // failure_policy MASK: the survivors masked the failed rank, the handle goes on
    } catch (...) {
      std::string message;
      const moe_ep_status_t status = status_of_current_exception(&message);
      record(status, message);
      throw;
    }
  }

 private:
  moe_ep_status_t status_ = MOE_EP_SUCCESS;
  int32_t failed_rank_ = -1;
  std::string message_;
};

}  // namespace moe_ep
