#include "error.hpp"

#include <new>

namespace moe_ep {
namespace {
// Thread-local so that two threads using two handles never see each other's message.
thread_local std::string t_last_error;
}  // namespace

void set_last_error(const std::string& message) noexcept {
  try {
    t_last_error = message;
  } catch (...) {
    t_last_error.clear();  // out of memory while copying: keep an empty message
  }
}

void clear_last_error() noexcept { t_last_error.clear(); }

const char* last_error() noexcept { return t_last_error.c_str(); }

namespace {
void set_message(std::string* message, const char* text) noexcept {
  try {
    *message = text;
  } catch (...) {
    message->clear();  // no memory even for the message
  }
}
}  // namespace

moe_ep_status_t status_of_current_exception(std::string* message) noexcept {
  try {
    throw;
  } catch (const Error& e) {
    set_message(message, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_message(message, "out of host memory");
    return MOE_EP_ERROR_OUT_OF_MEMORY;
  } catch (const std::length_error&) {
    set_message(message, "out of host memory (a buffer too large to allocate)");
    return MOE_EP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    try {
      *message = std::string("internal error: ") + e.what();
    } catch (...) {
      message->clear();
    }
    return MOE_EP_ERROR_INTERNAL;
  } catch (...) {
    set_message(message, "internal error: unknown exception");
    return MOE_EP_ERROR_INTERNAL;
  }
}

const char* status_name(moe_ep_status_t status) noexcept {
  switch (status) {
    case MOE_EP_SUCCESS: return "MOE_EP_SUCCESS";
    case MOE_EP_ERROR_INVALID_ARGUMENT: return "MOE_EP_ERROR_INVALID_ARGUMENT";
    case MOE_EP_ERROR_UNSUPPORTED: return "MOE_EP_ERROR_UNSUPPORTED";
    case MOE_EP_ERROR_CUDA: return "MOE_EP_ERROR_CUDA";
    case MOE_EP_ERROR_BOOTSTRAP: return "MOE_EP_ERROR_BOOTSTRAP";
    case MOE_EP_ERROR_OUT_OF_MEMORY: return "MOE_EP_ERROR_OUT_OF_MEMORY";
    case MOE_EP_ERROR_TIMEOUT: return "MOE_EP_ERROR_TIMEOUT";
    case MOE_EP_ERROR_INVALID_STATE: return "MOE_EP_ERROR_INVALID_STATE";
    case MOE_EP_ERROR_INVALID_INPUT: return "MOE_EP_ERROR_INVALID_INPUT";
    case MOE_EP_ERROR_INTERNAL: return "MOE_EP_ERROR_INTERNAL";
    default: return "MOE_EP_ERROR_UNKNOWN";
  }
}

}  // namespace moe_ep
