#include "nvlink/fd_exchange.hpp"

#include <poll.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "collective_step.hpp"
#include "error.hpp"

namespace moe_ep {

namespace fd_exchange_wire {

bool socket_address(const Invitation& invitation, sockaddr_un* addr, socklen_t* length) {
  const size_t n = strnlen(invitation.path, sizeof(invitation.path));
  if (n == 0 || n >= sizeof(invitation.path) || invitation.path[0] != '/') return false;
  *addr = sockaddr_un{};
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path, invitation.path, n);  // NUL-terminated: *addr was zeroed
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n + 1);
  return true;
}

}  // namespace fd_exchange_wire

namespace {

// One thread, started on first use and never joined, closes the descriptors
// handed to it in order.  A close that blocks (SO_LINGER on a full TCP queue)
// delays only the closes queued behind it, never a caller.  The object is
// never destroyed, so the thread never touches freed memory at exit.  A
// forked child has no such thread: it starts its own.
class Reaper {
 public:
  static Reaper& instance() {
    static Reaper* reaper = new Reaper;
    return *reaper;
  }

  void add(int fd) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(fd);
    if (started_by_ != getpid()) {
      try {
        std::thread(&Reaper::run, this).detach();
        started_by_ = getpid();
      } catch (const std::system_error&) {
        // No thread now: the descriptor stays queued (held, not closed) and
        // the next add tries again.  Leaking it beats blocking the caller.
      }
    }
    ready_.notify_one();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return !queue_.empty(); });
      const int fd = queue_.front();
      queue_.pop_front();
      lock.unlock();
      ::close(fd);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<int> queue_;
  pid_t started_by_ = -1;  // the process whose thread runs (none yet: -1)
};

}  // namespace

void close_in_background(UniqueFd fd) {
  if (fd.valid()) Reaper::instance().add(fd.release());
}

namespace {

using fd_exchange_wire::Invitation;
using fd_exchange_wire::Message;
using fd_exchange_wire::Random;
using Clock = std::chrono::steady_clock;

// The most descriptors one datagram can carry (the kernel's SCM_MAX_FD).  The
// control buffer holds them all: descriptors that do not fit would be closed
// by the kernel inside recvmsg, on this thread, where a lingering close blocks.
constexpr int kMaxDescriptorsPerDatagram = 253;

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

// A base directory where another user cannot rename or replace what we make:
// a directory that others cannot write, or can only under the sticky bit.
bool usable_base(const char* base) {
  struct stat st {};
  if (base == nullptr || base[0] != '/' || lstat(base, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  return (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st.st_mode & S_ISVTX) != 0;
}

// "<base>/moe_ep-XXXXXX", mode 0700, made by mkdtemp: a fresh name nobody
// could have chosen first.  Leaves room for "/s" within sun_path.
std::string make_private_directory() {
  std::string tried;
  const char* bases[] = {std::getenv("XDG_RUNTIME_DIR"), "/tmp"};
  for (const char* base : bases) {
    if (!usable_base(base)) continue;
    std::string name = std::string(base) + "/moe_ep-XXXXXX";
    if (name.size() + 3 > fd_exchange_wire::kPathBytes) continue;
    if (mkdtemp(&name[0]) != nullptr) return name;
    tried += std::string(tried.empty() ? "" : ", ") + base + " (" + std::strerror(errno) + ")";
  }
  fail(MOE_EP_ERROR_BOOTSTRAP, "fd exchange: could not make a private directory for its socket under ",
       "$XDG_RUNTIME_DIR or /tmp", tried.empty() ? std::string() : ": " + tried);
}

// What one datagram held once its ancillary data were parsed.  Descriptors
// still held when it goes are closed in the background (close_in_background).
struct Datagram {
  Datagram() = default;
  Datagram(const Datagram&) = delete;
  Datagram& operator=(const Datagram&) = delete;
  ~Datagram() {
    for (UniqueFd& fd : fds) close_in_background(std::move(fd));
  }

  Message message{};
  size_t bytes = 0;
  bool truncated = false;
  bool has_credentials = false;
  ucred credentials{};
  std::vector<UniqueFd> fds;  // every descriptor it brought
};

class FdRound {
 public:
  FdRound(int me, int world, int my_fd, HandlePeers peers)
      : me_(me), world_(world), my_fd_(my_fd), my_uid_(getuid()), peers_(std::move(peers)), fds_(world) {}

  // Removes the socket's name and the directory; the socket itself is closed
  // in the background, as strangers' datagrams may still be queued in it.
  ~FdRound() {
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
    if (!directory_.empty()) ::rmdir(directory_.c_str());
    close_in_background(std::move(sock_));
  }
  FdRound(const FdRound&) = delete;
  FdRound& operator=(const FdRound&) = delete;

  // The private directory and the socket in it, with credentials on every
  // datagram it receives.  Returns the socket's path.
  const std::string& bind_socket() {
    sock_ = UniqueFd(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!sock_.valid()) fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("socket(AF_UNIX, SOCK_DGRAM)"));
    const int on = 1;
    if (setsockopt(sock_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0) {
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("setsockopt(SO_PASSCRED)"));
    }
    directory_ = make_private_directory();
    const std::string path = directory_ + "/s";
    Invitation me{};
    std::memcpy(me.path, path.c_str(), path.size() + 1);  // fits: make_private_directory left room
    sockaddr_un addr{};
    socklen_t length = 0;
    fd_exchange_wire::socket_address(me, &addr, &length);
    if (bind(sock_.get(), reinterpret_cast<const sockaddr*>(&addr), length) != 0) {
      fail(MOE_EP_ERROR_BOOTSTRAP, errno_text("bind(AF_UNIX socket " + path + ")"));
    }
    socket_path_ = path;
    return socket_path_;
  }

  // Every participant's record, from the exchange: the group's secret (the
  // lowest participant's), pids and socket paths.  A record this rank cannot
  // use fails.
  void join(const std::vector<Invitation>& invitations) {
    int first = 0;
    while (!peers_.participants[static_cast<size_t>(first)]) ++first;  // this rank takes part
    secret_ = invitations[first].secret;
    addresses_.resize(world_);
    lengths_.resize(world_);
    pids_.assign(world_, 0);
    for (int r = 0; r < world_; ++r) {
      if (!peers_.participants[static_cast<size_t>(r)]) continue;
      pids_[r] = invitations[r].pid;
      if (!fd_exchange_wire::socket_address(invitations[r], &addresses_[r], &lengths_[r])) {
        fail(MOE_EP_ERROR_INVALID_INPUT, "fd exchange: rank ", r,
             " published no usable socket path (expected a NUL-terminated absolute path of at most ",
             fd_exchange_wire::kPathBytes - 1, " bytes)");
      }
    }
  }

  // Sends to every peer and receives from every peer, interleaved, so that no
  // rank blocks on a full queue while its own queue waits to be read.
  void send_and_receive(Clock::time_point deadline, int timeout_ms) {
    std::vector<bool> sent(world_, false);
    int to_send = 0, expected = 0;
    for (int peer = 0; peer < world_; ++peer) {
      sent[peer] = !peers_.wants(peer, me_);
      to_send += sent[peer] ? 0 : 1;
      expected += peers_.wants(me_, peer) ? 1 : 0;
    }
    while (to_send > 0 || received_ < expected) {
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
      if (Clock::now() > deadline) {
        fail(MOE_EP_ERROR_BOOTSTRAP, "exchanging memory handles over AF_UNIX sockets timed out after ", timeout_ms,
             " ms on rank ", me_, " (", to_send, " peers not reached, ", expected - received_,
             " descriptors not received, ", dropped_,
             " datagrams from outside the group dropped; are all ranks in one PID namespace?)");
      }
      if (progress) continue;
      pollfd p{sock_.get(), POLLIN, 0};
      poll(&p, 1, 1);
    }
  }

  // After every rank has sent everything: whatever is still queued must be
  // a stranger's (dropped); a further message from a member fails.  Stops at
  // the deadline however many strangers keep sending; what is left unread
  // goes with the socket.
  void check_nothing_more_from_the_group(Clock::time_point deadline) {
    while (Clock::now() < deadline && try_receive() != Received::kNothing) {
    }
  }

  std::vector<UniqueFd> take_fds() { return std::move(fds_); }

 private:
  // Returns true when sent, false when the peer's queue is full (try again
  // later); throws on other errors.
  bool try_send(int peer) {
    Message m{secret_, me_};
    iovec iov{&m, sizeof(m)};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_name = &addresses_[peer];
    msg.msg_namelen = lengths_[peer];
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
      const bool missing = errno == ENOENT;
      fail(MOE_EP_ERROR_BOOTSTRAP,
           errno_text("sendmsg(SCM_RIGHTS) to rank " + std::to_string(peer) + "'s socket " +
                      std::string(addresses_[peer].sun_path)),
           missing ? " (do all ranks see one filesystem, the same /tmp or $XDG_RUNTIME_DIR?)" : "");
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
    for (int r = 0; r < world_; ++r) {
      if (peers_.participants[static_cast<size_t>(r)] && d.credentials.pid == pids_[r]) return true;
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
      ++dropped_;  // its descriptors are closed in the background
      return Received::kDropped;
    }
    const int claimed = d.message.rank;
    const bool well_formed = d.bytes == sizeof(Message) && !d.truncated && d.fds.size() == 1 &&
                             same_random(d.message.secret, secret_) && claimed >= 0 && claimed < world_ &&
                             peers_.wants(me_, claimed) && pids_[claimed] == d.credentials.pid;
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
  const int my_fd_;
  const uid_t my_uid_;
  const HandlePeers peers_;
  Random secret_{};
  std::vector<int32_t> pids_;
  std::vector<sockaddr_un> addresses_;
  std::vector<socklen_t> lengths_;
  std::vector<UniqueFd> fds_;
  std::string directory_;
  std::string socket_path_;
  UniqueFd sock_;
  int received_ = 0;
  int64_t dropped_ = 0;
};

}  // namespace

HandlePeers HandlePeers::everyone(int world) {
  HandlePeers p;
  p.participants.assign(static_cast<size_t>(world), 1);
  p.joining.assign(static_cast<size_t>(world), 1);
  return p;
}

std::vector<UniqueFd> exchange_fds(const Exchange& exchange, int my_fd, int timeout_ms) {
  return exchange_fds(exchange, my_fd, timeout_ms, HandlePeers::everyone(exchange.world_size()));
}

std::vector<UniqueFd> exchange_fds(const Exchange& exchange, int my_fd, int timeout_ms, const HandlePeers& peers) {
  const int world = exchange.world_size();
  const int me = exchange.rank();
  if (peers.participants.size() != static_cast<size_t>(world) || peers.joining.size() != static_cast<size_t>(world) ||
      !peers.participants[static_cast<size_t>(me)]) {
    fail(MOE_EP_ERROR_INTERNAL, "fd exchange: rank ", me, " is not among the exchange's participants");
  }
  int others = 0;
  for (int r = 0; r < world; ++r) others += r != me && peers.participants[static_cast<size_t>(r)] ? 1 : 0;
  if (others == 0) return std::vector<UniqueFd>(static_cast<size_t>(world));

  FdRound round(me, world, my_fd, peers);
  Invitation mine{};
  run_then_agree(exchange, [&] {  // every socket exists before anyone learns where
    mine.secret = draw_random();
    mine.pid = static_cast<int32_t>(getpid());
    mine.uid = static_cast<uint32_t>(getuid());
    const std::string& path = round.bind_socket();
    std::memcpy(mine.path, path.c_str(), path.size() + 1);
  });
  const std::vector<Invitation> invitations = exchange.allgather_value(mine, "fd exchange: invitations");
  run_then_agree(exchange, [&] {
    for (int r = 0; r < world; ++r) {
      if (peers.participants[static_cast<size_t>(r)] && invitations[r].uid != mine.uid) {
        // its messages would be dropped: say why now
        fail(MOE_EP_ERROR_UNSUPPORTED, "fd exchange: rank ", r, " runs as uid ", invitations[r].uid, ", rank ", me,
             " as uid ", mine.uid, "; descriptors are accepted only from the same user");
      }
    }
    round.join(invitations);
  });
  // One deadline for this rank's local work: sending, receiving and draining.
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  run_then_agree(exchange, [&] { round.send_and_receive(deadline, timeout_ms); });
  run_then_agree(exchange, [&] { round.check_nothing_more_from_the_group(deadline); });
  return round.take_fds();
}

}  // namespace moe_ep
