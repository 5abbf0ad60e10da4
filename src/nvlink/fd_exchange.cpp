#include "nvlink/fd_exchange.hpp"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "error.hpp"

namespace moe_ep {

namespace {

constexpr size_t kNonceBytes = 16;

struct Nonce {
  unsigned char bytes[kNonceBytes];
};

// What each datagram carries besides the descriptor.
struct Message {
  Nonce nonce;
  int32_t rank;
};

Nonce draw_nonce() {
  Nonce n{};
  size_t got = 0;
  while (got < sizeof(n.bytes)) {
    const ssize_t r = getrandom(n.bytes + got, sizeof(n.bytes) - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got < sizeof(n.bytes)) {  // no getrandom: pid and time still make collisions unlikely
    const uint64_t mix[2] = {static_cast<uint64_t>(getpid()),
                             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
    std::memcpy(n.bytes, mix, sizeof(n.bytes));
  }
  return n;
}

// Abstract socket address "\0moe_ep-<nonce hex>-<rank>".
sockaddr_un socket_address(const Nonce& nonce, int rank, socklen_t* length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  char name[96];
  int at = std::snprintf(name, sizeof(name), "moe_ep-");
  for (unsigned char b : nonce.bytes) at += std::snprintf(name + at, sizeof(name) - at, "%02x", b);
  std::snprintf(name + at, sizeof(name) - at, "-%d", rank);
  const size_t n = std::strlen(name);
  std::memcpy(addr.sun_path + 1, name, n);  // sun_path[0] = '\0': abstract namespace
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Sends the descriptor to one peer.  Returns true when sent, false when the
// peer's queue is full (try again later); throws on other errors.
bool try_send(int sock, const Nonce& nonce, int me, int peer, int fd) {
  socklen_t length = 0;
  sockaddr_un addr = socket_address(nonce, peer, &length);
  Message m{nonce, me};
  iovec iov{&m, sizeof(m)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = length;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    if (sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return true;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
    fail(MOE_EP_ERROR_BOOTSTRAP, errno_text(("sendmsg(SCM_RIGHTS) to rank " + std::to_string(peer)).c_str()));
  }
}

// Receives one datagram if any is queued.  Returns the sender's rank and sets
// *fd, or -1 when nothing was queued or the datagram was not ours.
int try_receive(int sock, const Nonce& nonce, int world, UniqueFd* fd) {
  Message m{};
  iovec iov{&m, sizeof(m)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return -1;
    fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("recvmsg(SCM_RIGHTS)"));
  }
  UniqueFd received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int value = -1;
      std::memcpy(&value, CMSG_DATA(c), sizeof(int));
      received = UniqueFd(value);
    }
  }
  const bool ours = static_cast<size_t>(got) == sizeof(m) && (msg.msg_flags & MSG_CTRUNC) == 0 &&
                    std::memcmp(&m.nonce, &nonce, sizeof(nonce)) == 0 && m.rank >= 0 && m.rank < world &&
                    received.valid();
  if (!ours) return -1;  // a stray datagram: dropped (its descriptor closed)
  *fd = std::move(received);
  return m.rank;
}

// Binds this rank's socket.
UniqueFd bind_socket(const Nonce& nonce, int me) {
  UniqueFd sock(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("socket(AF_UNIX, SOCK_DGRAM)"));
  socklen_t length = 0;
  const sockaddr_un addr = socket_address(nonce, me, &length);
  if (bind(sock.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
    fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("bind(abstract AF_UNIX socket)"));
  }
  return sock;
}

// Sends to every peer and receives from every peer, interleaved, so that no
// rank blocks on a full queue while its own queue waits to be read.
void send_and_receive(int sock, const Nonce& nonce, int me, int world, int my_fd, int timeout_ms,
                      std::vector<UniqueFd>* fds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<bool> sent(world, false);
  int to_send = world - 1, to_receive = world - 1;
  sent[me] = true;
  while (to_send > 0 || to_receive > 0) {
    bool progress = false;
    for (int peer = 0; peer < world; ++peer) {
      if (!sent[peer] && try_send(sock, nonce, me, peer, my_fd)) {
        sent[peer] = true;
        --to_send;
        progress = true;
      }
    }
    UniqueFd fd;
    const int from = try_receive(sock, nonce, world, &fd);
    if (from >= 0 && from != me && !(*fds)[from].valid()) {
      (*fds)[from] = std::move(fd);
      --to_receive;
      progress = true;
    }
    if (progress) continue;
    if (std::chrono::steady_clock::now() > deadline) {
      fail(MOE_EP_ERROR_BOOTSTRAP, "exchanging memory handles over AF_UNIX sockets timed out after ", timeout_ms,
           " ms (", to_send, " peers not reached, ", to_receive,
           " descriptors not received; are all ranks in one network namespace?)");
    }
    pollfd p{sock, POLLIN, 0};
    poll(&p, 1, 1);
  }
}

}  // namespace

std::vector<UniqueFd> exchange_fds(const Bootstrap& bootstrap, int my_fd, int timeout_ms) {
  const int me = bootstrap.rank(), world = bootstrap.world_size();
  std::vector<UniqueFd> fds(world);
  if (world == 1) return fds;
  const Nonce nonce = bootstrap.allgather_value(draw_nonce())[0];  // rank 0's

  UniqueFd sock;
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
  try {
    sock = bind_socket(nonce, me);
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  }
  bootstrap.agree(status, message);  // every socket exists before anyone sends

  try {
    send_and_receive(sock.get(), nonce, me, world, my_fd, timeout_ms, &fds);
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  }
  bootstrap.agree(status, message);
  return fds;
}

}  // namespace moe_ep
