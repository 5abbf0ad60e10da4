// Passing file descriptors between the ranks of one host: each rank binds an
// AF_UNIX datagram socket in a private directory of its own and sends its
// descriptor to every peer with SCM_RIGHTS (no ptrace rights needed).
//
// Who can reach the socket: the directory is made by mkdtemp (mode 0700,
// owned by this user, a name nobody can choose first) under $XDG_RUNTIME_DIR
// or /tmp, and its path travels only through the bootstrap.  Another user can
// neither send to the socket nor bind a name in the directory, so no stranger
// of another uid sends a single datagram and no name can be squatted; the
// abstract namespace, by contrast, has no permissions and lists its names in
// /proc/net/unix.  The directory and the socket file are removed when the
// exchange ends, however it ends.
//
// Who is trusted: only the bootstrap.  A process of our own uid can still
// reach the socket, so a datagram is accepted only when the kernel-checked
// credentials it carries (SO_PASSCRED / SCM_CREDENTIALS) name our uid and
// exactly the pid that the claimed rank published through the bootstrap, and
// it carries the group's secret (random, exchanged through the bootstrap, part
// of no path).  A datagram socket cannot check credentials before its
// descriptors are installed (the kernel installs them with the data), so a
// stranger's descriptors are received and then closed on a detached thread,
// never on the caller's: closing a descriptor can block (a TCP socket with
// SO_LINGER and a full send queue), and so can closing our socket with such
// datagrams still queued.  Every loop runs against the exchange's deadline.
// A duplicate or malformed message from a group member fails the exchange on
// every rank.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "nvlink/unique_fd.hpp"

namespace moe_ep {

// Who sends its descriptor to whom.  At create every rank takes part and
// every rank is new: each sends to every other.  When a replacement process
// rejoins a group (failure_policy MASK), the participants are the ranks
// active after the change and the joining ranks are the new ones: a joining
// rank needs every participant's descriptor, the others need only the
// joining ranks' (they hold each other's already).
struct HandlePeers {
  std::vector<uint8_t> participants;  // 1 = takes part in this exchange
  std::vector<uint8_t> joining;       // 1 = has nobody's descriptor yet

  static HandlePeers everyone(int world);
  // Whether rank `to` receives the descriptor of rank `from`.
  bool wants(int to, int from) const {
    return to != from && participants[static_cast<size_t>(to)] && participants[static_cast<size_t>(from)] &&
           (joining[static_cast<size_t>(to)] || joining[static_cast<size_t>(from)]);
  }
};

// Collective among peers.participants (the exchange's non-participants take
// no part).  Returns, for every rank r that this rank wants, a descriptor
// received from r (the other entries are empty).  Fails on every participant
// (BOOTSTRAP error with a message) if any cannot bind, send or receive within
// timeout_ms, or receives a duplicate, unexpected or malformed message from a
// member of the group.  The local work of the exchange (sending, receiving,
// draining, closing) ends within timeout_ms whatever strangers send; the
// exchange steps around it are bounded by the exchange.
std::vector<UniqueFd> exchange_fds(const Exchange& exchange, int my_fd, int timeout_ms, const HandlePeers& peers);
// The exchange of create: every rank with every rank.
std::vector<UniqueFd> exchange_fds(const Exchange& exchange, int my_fd, int timeout_ms);

// Closes `fd` on a detached thread: the caller never waits for it, however
// long the close takes.  For descriptors that came from outside this process.
void close_in_background(UniqueFd fd);

// The wire format, exposed so that tests can play an intruder that knows
// everything but cannot forge kernel credentials.
namespace fd_exchange_wire {

constexpr size_t kRandomBytes = 16;
constexpr size_t kPathBytes = sizeof(sockaddr_un::sun_path);

struct Random {
  unsigned char bytes[kRandomBytes];
};

// What every rank contributes to the exchange's one allgather.  The group
// uses the lowest participant's secret.
struct Invitation {
  Random secret;          // carried in every message, never in a path
  int32_t pid;            // the pid this rank's messages must carry
  uint32_t uid;           // every rank must run as the same user (checked before anything is sent)
  char path[kPathBytes];  // this rank's socket, NUL-terminated, inside its private directory
};

// One datagram: this, plus exactly one descriptor in SCM_RIGHTS.
struct Message {
  Random secret;
  int32_t rank;  // the sender's rank
};

// Filesystem socket address of the rank that published `invitation`; false
// when its path is not a NUL-terminated absolute path that fits sun_path.
bool socket_address(const Invitation& invitation, sockaddr_un* addr, socklen_t* length);

}  // namespace fd_exchange_wire

}  // namespace moe_ep
