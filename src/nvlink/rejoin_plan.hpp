// What the ranks of an NVLINK_TWO_SIDED group under failure_policy MASK
// decide when ranks come back into the mask (a replacement process that
// rejoins, or a masked rank made active again): who exchanges memory handles
// with whom, and the settings a returning rank must share with the group.
// Host logic only, so that it is tested without a GPU.
#pragma once

#include <cstdint>
#include <vector>

#include "bootstrap.hpp"
#include "nvlink/fd_exchange.hpp"

namespace moe_ep {

// The ranks active after the change take part; the ones not active before
// it are the joining ones (they need every participant's memory, the others
// only theirs).
HandlePeers rejoin_peers(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after);
bool any_joining(const HandlePeers& peers);

// What each participant brings to the settings check.
struct RejoinSettings {
  int32_t combine_schedule = 0;     // the combine schedule and phase count, as create compares them
  int32_t group_min_sm_budget = 0;  // a member's: the group's smallest SM budget, fixed at create
  int32_t sm_budget = 0;            // a joining rank's own
};

// Collective among peers.participants (one allgather on `exchange`, then
// the same checks on every participant, so all fail alike): one combine
// schedule, one group minimum among the members, and no joining rank below
// it (the minimum decides the combine schedule, which captured graphs hold:
// it must not change).  Returns the group's minimum SM budget.
int32_t agree_on_rejoin_settings(const Exchange& exchange, const HandlePeers& peers, const RejoinSettings& mine);

}  // namespace moe_ep
