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

// The status and message of the exception being handled (call inside a catch
// block): a moe_ep::Error keeps its own, running out of host memory
// (std::bad_alloc, or std::length_error: a container asked for more than it
// can hold) is OUT_OF_MEMORY, anything else INTERNAL.  The one mapping of the
// library: the C shim, collective steps and the bootstrap thread all use it.
moe_ep_status_t status_of_current_exception(std::string* message) noexcept;

void set_last_error(const std::string& message) noexcept;
void clear_last_error() noexcept;
const char* last_error() noexcept;
const char* status_name(moe_ep_status_t status) noexcept;

}  // namespace moe_ep
