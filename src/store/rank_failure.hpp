// What a fault-tolerant exchange throws when peers failed and the survivors
// agreed to go on without them (config->failure_policy = MASK): the status is
// TIMEOUT, but the handle stays usable, so the handle's health does not
// record it as sticky (handle_health.hpp).  Carries the mask the survivors
// agreed on, and the ranks it dropped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "error.hpp"

namespace moe_ep {

class RankFailure : public Error {
 public:
  RankFailure(const std::string& message, std::vector<uint8_t> active, std::vector<int32_t> failed)
      : Error(MOE_EP_ERROR_TIMEOUT, message), active_(std::move(active)), failed_(std::move(failed)) {}

  const std::vector<uint8_t>& active() const noexcept { return active_; }  // the new mask
  const std::vector<int32_t>& failed() const noexcept { return failed_; }  // ascending, at least one

 private:
  std::vector<uint8_t> active_;
  std::vector<int32_t> failed_;
};

}  // namespace moe_ep
