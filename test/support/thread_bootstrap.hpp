// An in-process bootstrap: N ranks as N threads sharing one allgather buffer.
// Lets single-process tests exercise multi-rank behaviour without MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "moe_ep_c.h"

namespace moe_ep_test {

// A hostile or buggy bootstrap, for trust tests: called on rank `rank` after
// each allgather with what that rank received (world_size * bytes_per_rank
// bytes), which it may rewrite.  `call` counts this rank's allgathers from 0.
using Tamper = std::function<void(int rank, int64_t call, void* recv, size_t bytes_per_rank)>;

// A group of one: allgather copies send to recv, barrier returns at once.
moe_ep_bootstrap_t single_rank_bootstrap();

// Runs body(rank, bootstrap) on `world_size` threads and joins them.  Any
// exception thrown by a body is rethrown (the first one) after the join.
//
// After the bodies return, callbacks still blocked in the group (a library
// thread that gave up waiting, after a TIMEOUT) are made to fail (return -1),
// and the group is kept alive until all of them have left it.
void run_ranks(int world_size, const std::function<void(int rank, const moe_ep_bootstrap_t& b)>& body,
               const Tamper& tamper = nullptr);

}  // namespace moe_ep_test
