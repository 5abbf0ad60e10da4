#include "nvlink/fd_exchange.hpp"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "collective_step.hpp"
#include "error.hpp"

namespace moe_ep {

namespace fd_exchange_wire {

// "\0moe_ep-<name hex>-<rank>": the name is random, but public once bound.
sockaddr_un socket_address(const Random& name, int rank, socklen_t* length) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  char text[96];
  int at = std::snprintf(text, sizeof(text), "moe_ep-");
  for (unsigned char b : name.bytes) at += std::snprintf(text + at, sizeof(text) - at, "%02x", b);
  std::snprintf(text + at, sizeof(text) - at, "-%d", rank);
  const size_t n = std::strlen(text);
  std::memcpy(addr.sun_path + 1, text, n);  // sun_path[0] = '\0': abstract namespace
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return addr;
}

}  // namespace fd_exchange_wire

namespace {

using fd_exchange_wire::Invitation;
using fd_exchange_wire::Message;
using fd_exchange_wire::Random;

// Descriptors one datagram may bring that we still close: an intruder may
// attach many; whatever does not fit is discarded by the kernel (MSG_CTRUNC).
constexpr int kMaxDescriptorsPerDatagram = 16;

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

// Random bytes from the kernel; a secret nobody can guess, or an error.
Random draw_random() {
  Random r{};
  size_t got = 0;
  while (got < sizeof(r.bytes)) {
    const ssize_t n = getrandom(r.bytes + got, sizeof(r.bytes) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("getrandom (the fd exchange's secret)"));
    got += static_cast<size_t>(n);
  }
  return r;
}

bool same_random(const Random& a, const Random& b) {
  unsigned char diff = 0;  // constant time: the comparison leaks nothing about the secret
  for (size_t i = 0; i < sizeof(a.bytes); ++i) diff |= a.bytes[i] ^ b.bytes[i];
  return diff == 0;
}

// What one datagram held once its ancillary data were parsed.
struct Datagram {
  Message message{};
  size_t bytes = 0;
  bool truncated = false;
  bool has_credentials = false;
  ucred credentials{};
  std::vector<UniqueFd> fds;  // every descriptor it brought, closed unless taken
};

class FdRound {
 public:
  FdRound(const Bootstrap& bootstrap, const std::vector<Invitation>& invitations, int my_fd)
      : me_(bootstrap.rank()),
        world_(bootstrap.world_size()),
        name_(invitations[0].name),
        secret_(invitations[0].secret),
        my_fd_(my_fd),
        my_uid_(getuid()),
        fds_(world_) {
    for (const Invitation& i : invitations) pids_.push_back(i.pid);
  }

  // The socket, with credentials on every datagram it receives.
  void bind_socket() {
    sock_ = UniqueFd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock_.valid()) fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("socket(AF_UNIX, SOCK_DGRAM)"));
    const int on = 1;
    if (setsockopt(sock_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) {
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("setsockopt(SO_PASSCRED)"));
    }
    socklen_t length = 0;
    const sockaddr_un addr = fd_exchange_wire::socket_address(name_, me_, &length);
    if (bind(sock_.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("bind(abstract AF_UNIX socket)"));
    }
  }

  // Sends to every peer and receives from every peer, interleaved, so that no
  // rank blocks on a full queue while its own queue waits to be read.
  void send_and_receive(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::vector<bool> sent(world_, false);
    int to_send = world_ - 1;
    sent[me_] = true;
    while (to_send > 0 || received_ < world_ - 1) {
      bool progress = false;
      for (int peer = 0; peer < world_; ++peer) {
        if (!sent[peer] && try_send(peer)) {
          sent[peer] = true;
          --to_send;
          progress = true;
        }
      }
      // A dropped datagram is progress too (the queue drains quickly), but
      // the deadline holds however many strangers keep sending.
      if (try_receive() != Received::kNothing) progress = true;
      if (std::chrono::steady_clock::now() > deadline) {
        fail(MOE_EP_ERROR_BOOTSTRAP, "exchanging memory handles over AF_UNIX sockets timed out after ", timeout_ms,
             " ms on rank ", me_, " (", to_send, " peers not reached, ", world_ - 1 - received_,
             " descriptors not received, ", dropped_,
             " datagrams from outside the group dropped; are all ranks in one network and one PID namespace?)");
      }
      if (progress) continue;
      pollfd p{sock_.get(), POLLIN, 0};
      poll(&p, 1, 1);
    }
  }

  // After every rank has sent everything: whatever is still queued must be
  // a stranger's (dropped); a further message from a member fails.
  void check_nothing_more_from_the_group() {
    while (try_receive() != Received::kNothing) {
    }
  }

  std::vector<UniqueFd> take_fds() { return std::move(fds_); }

 private:
  // Returns true when sent, false when the peer's queue is full (try again
  // later); throws on other errors.
  bool try_send(int peer) {
    socklen_t length = 0;
    sockaddr_un addr = fd_exchange_wire::socket_address(name_, peer, &length);
    Message m{secret_, me_};
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
    std::memcpy(CMSG_DATA(c), &my_fd_, sizeof(int));
    // The kernel attaches our credentials (the receiver asked with SO_PASSCRED).
    for (;;) {
      if (sendmsg(sock_.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return true;
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("sendmsg(SCM_RIGHTS) to rank " + std::to_string(peer)));
    }
  }

  // Reads one queued datagram, if any; all of its descriptors are owned.
  bool read_datagram(Datagram* d) {
    iovec iov{&d->message, sizeof(d->message)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxDescriptorsPerDatagram)];
    std::memset(control, 0, sizeof(control));
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t got;
    do {
      got = recvmsg(sock_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("recvmsg(SCM_RIGHTS)"));
    }
    d->bytes = static_cast<size_t>(got);
    d->truncated = (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
        const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; ++i) {
          int value = -1;
          std::memcpy(&value, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          d->fds.emplace_back(value);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
        std::memcpy(&d->credentials, CMSG_DATA(c), sizeof(ucred));
        d->has_credentials = true;
      }
    }
    return true;
  }

  // A datagram whose kernel-checked sender is our uid and the pid of some
  // rank of the group.  Anything else is a stranger's and is dropped.
  bool from_group_member(const Datagram& d) const {
    if (!d.has_credentials || d.credentials.uid != my_uid_) return false;
    for (int32_t pid : pids_) {
      if (d.credentials.pid == pid) return true;
    }
    return false;
  }

  enum class Received { kNothing, kDropped, kTaken };

  // Receives one datagram if any is queued: a peer's descriptor is taken, a
  // stranger's datagram dropped.  A bad message from a group member fails.
  Received try_receive() {
    Datagram d;
    if (!read_datagram(&d)) return Received::kNothing;
    if (!from_group_member(d)) {
      ++dropped_;  // its descriptors close with d
      return Received::kDropped;
    }
    const int claimed = d.message.rank;
    const bool well_formed = d.bytes == sizeof(Message) && !d.truncated && d.fds.size() == 1 &&
                             same_random(d.message.secret, secret_) && claimed >= 0 && claimed < world_ &&
                             claimed != me_ && pids_[claimed] == d.credentials.pid;
    if (!well_formed) {
      fail(MOE_EP_ERROR_BOOTSTRAP, "fd exchange on rank ", me_, ": unexpected message from pid ",
           d.credentials.pid, " (a member of this group: ", d.bytes, " bytes, ", d.fds.size(),
           " descriptors, claimed rank ", claimed, ", secret ",
           same_random(d.message.secret, secret_) ? "right" : "wrong", ")");
    }
    if (fds_[claimed].valid()) {
      fail(MOE_EP_ERROR_BOOTSTRAP, "fd exchange on rank ", me_, ": a second descriptor from rank ", claimed,
           " (pid ", d.credentials.pid, "); each rank sends exactly one");
    }
    fds_[claimed] = std::move(d.fds[0]);
    ++received_;
    return Received::kTaken;
  }

  const int me_;
  const int world_;
  const Random name_;
  const Random secret_;
  const int my_fd_;
  const uid_t my_uid_;
  std::vector<int32_t> pids_;
  std::vector<UniqueFd> fds_;
  UniqueFd sock_;
  int received_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace

std::vector<UniqueFd> exchange_fds(const Bootstrap& bootstrap, int my_fd, int timeout_ms) {
  const int world = bootstrap.world_size();
  if (world == 1) return std::vector<UniqueFd>(1);

  Invitation mine{};
  run_then_agree(bootstrap, [&] {
    mine.name = draw_random();
    mine.secret = draw_random();
    mine.pid = static_cast<int32_t>(getpid());
    mine.uid = static_cast<uint32_t>(getuid());
  });
  const std::vector<Invitation> invitations = bootstrap.allgather_value(mine);
  FdRound exchange(bootstrap, invitations, my_fd);
  run_then_agree(bootstrap, [&] {  // every socket exists before anyone sends
    for (int r = 0; r < world; ++r) {
      if (invitations[r].uid != mine.uid) {  // its messages would be dropped: say why now
        fail(MOE_EP_ERROR_UNSUPPORTED, "fd exchange: rank ", r, " runs as uid ", invitations[r].uid, ", rank ",
             bootstrap.rank(), " as uid ", mine.uid, "; descriptors are accepted only from the same user");
      }
    }
    exchange.bind_socket();
  });
  run_then_agree(bootstrap, [&] { exchange.send_and_receive(timeout_ms); });
  run_then_agree(bootstrap, [&] { exchange.check_nothing_more_from_the_group(); });
  return exchange.take_fds();
}

}  // namespace moe_ep
