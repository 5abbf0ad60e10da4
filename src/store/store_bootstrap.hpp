// moe_ep_bootstrap_from_store: the bootstrap callbacks over the store, for
// launchers without MPI (and the fork-based tests).  Allgather k posts this
// rank's bytes at <prefix>/b<k>/r<rank> and reads every rank's, all reads
// bounded by timeout_ms; barrier is a one-byte allgather.  A rank's key of
// allgather k - 1 is erased once allgather k completed (every rank posted k,
// so every rank is done with k - 1).
#pragma once

#include <cstdint>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep {

moe_ep_bootstrap_t make_store_bootstrap(const std::string& address, const std::string& prefix, int32_t rank,
                                        int32_t world_size, int32_t timeout_ms);
// False when `b` was not made by make_store_bootstrap (nothing is done).
bool release_store_bootstrap(moe_ep_bootstrap_t* b);

}  // namespace moe_ep
