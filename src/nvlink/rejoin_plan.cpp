#include "nvlink/rejoin_plan.hpp"

#include <string>

#include "error.hpp"

namespace moe_ep {

HandlePeers rejoin_peers(const std::vector<uint8_t>& before, const std::vector<uint8_t>& after) {
  HandlePeers p;
  p.participants.assign(after.size(), 0);
  p.joining.assign(after.size(), 0);
  for (size_t r = 0; r < after.size(); ++r) {
    p.participants[r] = after[r] ? 1 : 0;
    p.joining[r] = after[r] && !(r < before.size() && before[r]) ? 1 : 0;
  }
  return p;
}

bool any_joining(const HandlePeers& peers) {
  for (uint8_t j : peers.joining) {
    if (j) return true;
  }
  return false;
}

int32_t agree_on_rejoin_settings(const Exchange& exchange, const HandlePeers& peers, const RejoinSettings& mine) {
  const std::vector<RejoinSettings> all = exchange.allgather_value(mine, "rejoin: settings");
  const int32_t world = exchange.world_size();
  int32_t lead = -1;  // the lowest participant that is a member already
  for (int32_t r = 0; r < world && lead < 0; ++r) {
    if (peers.participants[static_cast<size_t>(r)] && !peers.joining[static_cast<size_t>(r)]) lead = r;
  }
  if (lead < 0) fail(MOE_EP_ERROR_INVALID_STATE, "rejoin: no active rank of the group takes part");
  const RejoinSettings& L = all[static_cast<size_t>(lead)];
  for (int32_t r = 0; r < world; ++r) {
    if (!peers.participants[static_cast<size_t>(r)]) continue;
    const RejoinSettings& s = all[static_cast<size_t>(r)];
    if (s.combine_schedule != L.combine_schedule) {
      fail(MOE_EP_ERROR_INVALID_ARGUMENT,
           "MOE_EP_COMBINE_SCHEDULE / MOE_EP_COMBINE_PHASES: expected the same value on every rank, got ",
           L.combine_schedule, " on rank ", lead, " and ", s.combine_schedule, " on rank ", r);
    }
    if (!peers.joining[static_cast<size_t>(r)] && s.group_min_sm_budget != L.group_min_sm_budget) {
      fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: rank ", r, " holds ", s.group_min_sm_budget,
           " as the group's smallest SM budget, rank ", lead, " ", L.group_min_sm_budget);
    }
    if (peers.joining[static_cast<size_t>(r)] && s.sm_budget < L.group_min_sm_budget) {
      fail(MOE_EP_ERROR_INVALID_ARGUMENT, "config->num_sms: rank ", r, " would rejoin with ", s.sm_budget,
           " SMs, fewer than the group's smallest budget at create, ", L.group_min_sm_budget,
           " (it decides the combine schedule every rank runs)");
    }
  }
  return L.group_min_sm_budget;
}

}  // namespace moe_ep
