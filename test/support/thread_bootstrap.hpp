// An in-process bootstrap: N ranks as N threads sharing one allgather buffer.
// Lets single-process tests exercise multi-rank behaviour without MPI.
#pragma once

#include <functional>

#include "moe_ep_c.h"

namespace moe_ep_test {

// Runs body(rank, bootstrap) on `world_size` threads and joins them.  Any
// exception thrown by a body is rethrown (the first one) after the join.
void run_ranks(int world_size, const std::function<void(int rank, const moe_ep_bootstrap_t& b)>& body);

}  // namespace moe_ep_test
