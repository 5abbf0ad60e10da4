// Passing file descriptors between the ranks of one host: each rank binds an
// AF_UNIX datagram socket in the abstract namespace (no file, no cleanup, no
// ptrace rights needed) and sends its descriptor to every peer with
// SCM_RIGHTS.
//
// Who is trusted: only the bootstrap.  Socket names are visible to every
// local user (/proc/net/unix), so anyone may send to them; a datagram is
// accepted only when the kernel-checked credentials it carries
// (SO_PASSCRED / SCM_CREDENTIALS) name our own uid and exactly the pid that
// the claimed rank published through the bootstrap, and it carries the
// group's secret (random, exchanged through the bootstrap, part of no socket
// name).  A datagram from anyone else is dropped and its descriptors closed;
// a duplicate or malformed message from a group member fails the exchange on
// every rank.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <vector>

#include "bootstrap.hpp"
#include "nvlink/unique_fd.hpp"

namespace moe_ep {

// Collective.  Returns, for every rank r != this rank, a descriptor received
// from r (this rank's entry is empty).  Fails on every rank (BOOTSTRAP error
// with a message) if any rank cannot bind, send or receive within timeout_ms,
// or receives a duplicate or malformed message from a member of the group.
std::vector<UniqueFd> exchange_fds(const Bootstrap& bootstrap, int my_fd, int timeout_ms);

// The wire format, exposed so that tests can play an intruder that knows
// everything but cannot forge kernel credentials.
namespace fd_exchange_wire {

constexpr size_t kRandomBytes = 16;

struct Random {
  unsigned char bytes[kRandomBytes];
};

// What every rank contributes to the exchange's one bootstrap allgather.  The
// group uses rank 0's name and secret.
struct Invitation {
  Random name;    // makes the socket names of this exchange unique
  Random secret;  // carried in every message, never in a name
  int32_t pid;    // the pid this rank's messages must carry
  uint32_t uid;   // every rank must run as the same user (checked before any socket is bound)
};

// One datagram: this, plus exactly one descriptor in SCM_RIGHTS.
struct Message {
  Random secret;
  int32_t rank;  // the sender's rank
};

// Abstract socket address of `rank`'s socket in the exchange named `name`.
sockaddr_un socket_address(const Random& name, int rank, socklen_t* length);

}  // namespace fd_exchange_wire

}  // namespace moe_ep
