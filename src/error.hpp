// Errors inside the library are C++ exceptions carrying a moe_ep status; the
// C shim (c_api.cpp) turns them into a status and the thread-local message.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep {

class Error : public std::runtime_error {
 public:
  Error(moe_ep_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  moe_ep_status_t status() const noexcept { return status_; }

 private:
  moe_ep_status_t status_;
};

// Builds a message from any streamable pieces: fail(INVALID_ARGUMENT, "x: expected ", a, ", got ", b).
template <typename... Parts>
[[noreturn]] void fail(moe_ep_status_t status, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  throw Error(status, os.str());
}

// The standard message for a wrong argument: names it, the expected and the actual value.
template <typename Expected, typename Actual>
[[noreturn]] void fail_argument(const std::string& argument, const Expected& expected,
                                const Actual& actual) {
  fail(MOE_EP_ERROR_INVALID_ARGUMENT, argument, ": expected ", expected, ", got ", actual);
}

void set_last_error(const std::string& message) noexcept;
void clear_last_error() noexcept;
const char* last_error() noexcept;
const char* status_name(moe_ep_status_t status) noexcept;

}  // namespace moe_ep
