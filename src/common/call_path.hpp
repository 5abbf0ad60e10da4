// Which path each call of a handle takes (include/moe_ep_c.h: MOE_EP_PATH_*,
// MOE_EP_PHASE_*): a backend's path selector decides it, CallPaths records
// it for moe_ep_get_last_path and logs each new one at MOE_EP_LOG=info.
#pragma once

#include <stdint.h>

namespace moe_ep {

// The name moe_ep_path_name returns ("unknown" for other values).
const char* path_name(int32_t path) noexcept;

class CallPaths {
 public:
  // The path a call of `phase` (MOE_EP_PHASE_*) takes on `rank`; logged the
  // first time this handle takes it.
  void note(int32_t phase, int32_t path, int32_t rank);
  // MOE_EP_PATH_NONE before the first call of `phase`.
  int32_t last(int32_t phase) const noexcept;

 private:
  int32_t last_[2] = {0, 0};
  uint64_t logged_ = 0;  // one bit per path already logged (paths are below 64)
};

}  // namespace moe_ep
