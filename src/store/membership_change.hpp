// A change of the active-rank mask under failure_policy MASK: one exchange
// through the store among every rank active before or after it (a replacement
// process that rejoins included), then the same checks on every participant:
// every outcome of the local checks, one mask, the same group fingerprint (the
// parameters create compares: the credentials a rejoining process must show),
// and, for a rank that joins, the call sequence it adopts.  The epoch ends
// whatever the outcome, so the next change starts in a fresh key space.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collective_step.hpp"
#include "moe_ep_c.h"
#include "store/store_exchange.hpp"

namespace moe_ep {

struct MembershipState {
  std::vector<uint8_t> active;     // the mask
  uint64_t dispatch_sequence = 0;  // dispatches this group has run
  uint64_t mask_epoch = 0;         // mask changes (moe_ep_health_t.mask_epoch)
};

// At most one rank becomes active per mask change (each rejoin is its own
// agreement).  INVALID_ARGUMENT with the message naming them otherwise.
moe_ep_status_t check_one_newcomer(const std::vector<uint8_t>& current, const std::vector<uint8_t>& proposed,
                                   std::string* message);

// Collective among the ranks active in `current` or in `proposed`.  `status`
// and `message` are this rank's local outcome.  Returns the new state (the
// current one plus one epoch).  Throws the first refusal (on every
// participant), or RankFailure when a participant did not take part in time.
MembershipState change_membership(StoreExchange& exchange, const MembershipState& current,
                                  const std::vector<uint8_t>& proposed, moe_ep_status_t status,
                                  const std::string& message, const std::vector<RankValue>& fingerprint);

}  // namespace moe_ep
