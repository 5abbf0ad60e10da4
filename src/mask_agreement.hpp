// The agreement of moe_ep_set_active_ranks over the bootstrap, written once
// for every backend that takes it there (failure_policy FAIL_HANDLE): every
// rank learns every rank's local outcome, then every rank's mask, so that a
// refusal or a disagreement fails the call on every rank with one answer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "error.hpp"

namespace moe_ep {

// "{1,0,1}".
std::string mask_text(const std::vector<uint8_t>& mask);

// Collective.  Exchange::agree on `local_status` (this rank's checks), then
// one allgather of the masks, named `step` in its errors: INVALID_ARGUMENT
// on every rank when a rank's mask differs from rank 0's, naming the lowest
// such rank and both masks.
void agree_on_mask(const Exchange& exchange, const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                   const std::string& local_message, const char* step);

}  // namespace moe_ep
