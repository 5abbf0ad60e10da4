// Passing file descriptors between the ranks of one host: each rank binds an
// AF_UNIX datagram socket in the abstract namespace (no file, no cleanup, no
// ptrace rights needed) and sends its descriptor to every peer with
// SCM_RIGHTS.  Socket names carry a random nonce drawn by rank 0, so that
// concurrent groups and handles never cross.
#pragma once

#include <vector>

#include "bootstrap.hpp"
#include "nvlink/unique_fd.hpp"

namespace moe_ep {

// Collective.  Returns, for every rank r != this rank, a descriptor received
// from r (this rank's entry is empty).  Fails on every rank (BOOTSTRAP error
// with a message) if any rank cannot bind, send or receive within timeout_ms.
std::vector<UniqueFd> exchange_fds(const Bootstrap& bootstrap, int my_fd, int timeout_ms);

}  // namespace moe_ep
