#include "error.hpp"

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
