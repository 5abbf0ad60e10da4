// The AF_UNIX SCM_RIGHTS exchange that shares workspace handles between the
// ranks of one host, tested without a GPU: ranks are threads, and each passes
// a memfd holding its rank, so a received descriptor proves where it came from.
//
// The intruder cases play a local attacker who knows everything, the socket
// paths and even the group's secret, and injects datagrams carrying its own
// descriptors and claiming to be a rank, queued in every rank's socket before
// any genuine message: a process of another uid (needs root to switch uid),
// which the private directory keeps out before any datagram, and a process of
// our uid that is not in the group, which only the kernel-checked credentials
// tell apart.  The exchange must keep only the genuine descriptors (compared
// by device and inode), and must end within its bound whatever a stranger's
// descriptors do when closed.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap.hpp"
#include "error.hpp"
#include "nvlink/fd_exchange.hpp"
#include "thread_bootstrap.hpp"

namespace {

namespace wire = moe_ep::fd_exchange_wire;

int memfd_holding(int value) {
  const int fd = memfd_create("moe_ep_test", MFD_CLOEXEC);
  if (fd < 0 || write(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) return -1;
  return fd;
}

int value_in(int fd) {
  int v = -1;
  if (pread(fd, &v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) return -2;
  return v;
}

struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId& o) const { return dev == o.dev && ino == o.ino; }
};

FileId file_id(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return FileId{};
  return FileId{st.st_dev, st.st_ino};
}

using Invitations = std::vector<wire::Invitation>;

// Sends one message claiming `claimed_rank`, with `fds`, to `target`'s socket.
bool send_claim(int sock, const Invitations& group, int target, int32_t claimed_rank, const std::vector<int>& fds) {
  socklen_t length = 0;
  sockaddr_un addr{};
  if (!wire::socket_address(group[target], &addr, &length)) return false;
  wire::Message m{group[0].secret, claimed_rank};
  iovec iov{&m, sizeof(m)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = length;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
  std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  return sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0;
}

// A loopback TCP connection whose send queue is full (the listener never
// accepts nor reads) and whose close lingers `linger_s` seconds: the last
// close of it blocks that long.  Returns the client socket; the listener must
// stay open meanwhile (closing it resets the connection).
int lingering_socket(int linger_s, int* listener) {
  *listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  const int small = 4096;  // the connection's receive buffer (inherited from the listener) fills fast
  setsockopt(*listener, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  if (*listener < 0 || bind(*listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(*listener, 4) != 0 || getsockname(*listener, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    return -1;
  }
  const int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (client < 0 || connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  setsockopt(client, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  // Fill until the peer's window and our queue are both full: sending stays
  // refused for a while.
  std::vector<char> chunk(1 << 16, 'x');
  for (int refused = 0; refused < 5;) {
    if (send(client, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
      refused = 0;
    } else {
      ++refused;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const linger l{1, linger_s};
  if (setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) != 0) return -1;
  return client;
}

// What an intruder puts in its datagrams.
enum class Payload {
  kMemfd,      // a memfd of its own (planting a descriptor)
  kLingering,  // a lingering TCP socket (stalling whoever closes it)
};

// A forked process (of another uid when `uid` >= 0) that waits for the
// group's invitations on a pipe, then queues datagrams claiming every rank in
// every rank's socket, each with its own descriptor, and reports how many got
// in.  With `flood` it then keeps sending until it is stopped.  It also tries
// to bind a name next to every rank's socket (squatting), and reports how
// many it could.
class Intruder {
 public:
  struct Report {
    int queued = -1;
    int squatted = -1;
  };

  Intruder(int world, int uid, Payload payload = Payload::kMemfd, bool flood = false) {
    int go[2], done[2];
    REQUIRE(pipe(go) == 0);
    REQUIRE(pipe(done) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(go[1]);
      close(done[0]);
      _exit(run(world, uid, payload, flood, go[0], done[1]));
    }
    close(go[0]);
    close(done[1]);
    go_ = go[1];
    done_ = done[0];
  }
  ~Intruder() {
    if (go_ >= 0) close(go_);  // a child still waiting reads EOF and leaves
    if (done_ >= 0) close(done_);
    kill(pid_, SIGKILL);  // a flooding or lingering one stays until killed
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  // Lets it loose with the group's invitations; returns what it did (-1: it failed).
  Report attack(const Invitations& group) {
    Report report;
    const ssize_t bytes = static_cast<ssize_t>(sizeof(wire::Invitation) * group.size());
    if (write(go_, group.data(), bytes) != bytes) return report;
    if (read(done_, &report, sizeof(report)) != static_cast<ssize_t>(sizeof(report))) return Report{};
    return report;
  }

  static constexpr int kValue = 0xBAD;
  static constexpr int kLingerSeconds = 20;

 private:
  static int run(int world, int uid, Payload payload, bool flood, int go, int done) {
    if (uid >= 0) {
      if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) return 2;
    }
    int listener = -1;
    const int mine = payload == Payload::kMemfd ? memfd_holding(kValue) : lingering_socket(kLingerSeconds, &listener);
    const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (mine < 0 || sock < 0) return 3;
    Invitations group(world);
    const ssize_t bytes = static_cast<ssize_t>(sizeof(wire::Invitation) * world);
    if (read(go, group.data(), bytes) != bytes) return 0;  // not needed
    Report report{0, 0};
    for (int target = 0; target < world; ++target) {
      for (int claimed = 0; claimed < world; ++claimed) {
        if (claimed != target && send_claim(sock, group, target, claimed, {mine})) ++report.queued;
      }
      std::string squat(group[target].path, strnlen(group[target].path, sizeof(group[target].path)));
      squat += "x";
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      if (squat.size() < sizeof(addr.sun_path)) {
        std::memcpy(addr.sun_path, squat.c_str(), squat.size());
        const int s2 = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (bind(s2, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
          ++report.squatted;
          unlink(squat.c_str());
        }
        close(s2);
      }
    }
    if (payload == Payload::kLingering) close(mine);  // the receivers now hold the last references
    if (write(done, &report, sizeof(report)) != static_cast<ssize_t>(sizeof(report))) return 4;
    if (payload == Payload::kLingering && flood) {
      const int again = lingering_socket(kLingerSeconds, &listener);
      for (;;) {
        for (int target = 0; target < world; ++target) send_claim(sock, group, target, (target + 1) % world, {again});
      }
    }
    if (payload == Payload::kLingering) pause();  // keeps the listeners open: the queues stay full
    return 0;
  }

  pid_t pid_ = -1;
  int go_ = -1;
  int done_ = -1;
};

// A bootstrap that forwards to the thread bootstrap and, once every rank has
// its socket and the group's invitations are checked (the allgather after the
// one that carried the invitations), lets rank 0 run `inject` with them while
// the other ranks wait: whatever it queues arrives before any genuine message.
struct InjectingBootstrap {
  moe_ep_bootstrap_t inner{};
  std::function<void(const Invitations&)>* inject = nullptr;
  std::function<void(wire::Invitation*)>* edit_invitations = nullptr;  // what the bootstrap delivers
  Invitations group;
  int stage = 0;  // 0: before the invitations, 1: invitations seen, 2: injected

  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes) {
    auto* self = static_cast<InjectingBootstrap*>(ctx);
    const int32_t rc = self->inner.allgather(self->inner.ctx, send, recv, bytes);
    if (rc != 0) return rc;
    if (self->stage == 0 && bytes == sizeof(wire::Invitation)) {
      auto* all = static_cast<wire::Invitation*>(recv);
      if (self->edit_invitations) (*self->edit_invitations)(all);
      self->group.assign(all, all + self->inner.world_size);
      self->stage = 1;
    } else if (self->stage == 1) {
      self->stage = 2;
      if (self->inner.rank == 0) (*self->inject)(self->group);
      return self->inner.barrier(self->inner.ctx);
    }
    return 0;
  }
  static int32_t barrier(void* ctx) {
    auto* self = static_cast<InjectingBootstrap*>(ctx);
    return self->inner.barrier(self->inner.ctx);
  }
  moe_ep_bootstrap_t view() {
    moe_ep_bootstrap_t b = inner;
    b.ctx = this;
    b.allgather = &InjectingBootstrap::allgather;
    b.barrier = &InjectingBootstrap::barrier;
    return b;
  }
};

struct RankOutcome {
  std::string problems;
  std::string error;  // what exchange_fds threw, if it did
  moe_ep_status_t status = MOE_EP_SUCCESS;
  double seconds = 0;  // how long exchange_fds took on this rank
};

// One exchange among `world` thread ranks, with `inject` run by rank 0 once
// every socket is bound.  Checks that every descriptor received is the
// genuine one of its rank (same file, same content).
std::vector<RankOutcome> exchange_with_injection(int world, std::function<void(const Invitations&)> inject,
                                                 std::function<void(wire::Invitation*)> edit_invitations = nullptr,
                                                 int timeout_ms = 10000) {
  std::vector<RankOutcome> outcomes(world);
  std::vector<int> genuine(world);
  std::vector<FileId> genuine_ids(world);
  for (int r = 0; r < world; ++r) {
    genuine[r] = memfd_holding(1000 + r);
    genuine_ids[r] = file_id(genuine[r]);
  }
  moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    InjectingBootstrap spy;
    spy.inner = b;
    spy.inject = &inject;
    if (edit_invitations) spy.edit_invitations = &edit_invitations;
    const moe_ep_bootstrap_t viewed = spy.view();
    const moe_ep::Bootstrap bootstrap(&viewed);
    RankOutcome& out = outcomes[rank];
    const auto start = std::chrono::steady_clock::now();
    try {
      std::vector<moe_ep::UniqueFd> fds = moe_ep::exchange_fds(bootstrap, genuine[rank], timeout_ms);
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (int r = 0; r < world; ++r) {
        if (r == rank) continue;
        if (!fds[r].valid()) {
          out.problems += "nothing from rank " + std::to_string(r) + "; ";
        } else if (!(file_id(fds[r].get()) == genuine_ids[r]) || value_in(fds[r].get()) != 1000 + r) {
          out.problems += "a foreign descriptor as rank " + std::to_string(r) + " (holding " +
                          std::to_string(value_in(fds[r].get())) + "); ";
        }
      }
    } catch (const moe_ep::Error& e) {
      out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      out.status = e.status();
      out.error = e.what();
    }
  });
  for (int fd : genuine) close(fd);
  return outcomes;
}

void check_every_rank_got_the_genuine_descriptors(const std::vector<RankOutcome>& outcomes) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    INFO("rank " << r);
    CHECK(outcomes[r].error == "");
    CHECK(outcomes[r].problems == "");
  }
}

}  // namespace

TEST_CASE("every rank receives every peer's descriptor, and only those", "[fd_exchange]") {
  for (int world : {1, 2, 3, 8}) {
    std::vector<std::string> problems(world);
    moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
      const moe_ep::Bootstrap bootstrap(&b);
      const int mine = memfd_holding(1000 + rank);
      // Twice: each call draws its own socket names, so calls never cross.
      for (int round = 0; round < 2; ++round) {
        std::vector<moe_ep::UniqueFd> fds = moe_ep::exchange_fds(bootstrap, mine, 5000);
        for (int r = 0; r < world; ++r) {
          if (r == rank && fds[r].valid()) problems[rank] += "own entry set; ";
          if (r != rank && (!fds[r].valid() || value_in(fds[r].get()) != 1000 + r)) {
            problems[rank] += "bad descriptor from rank " + std::to_string(r) + "; ";
          }
        }
      }
      close(mine);
    });
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      CHECK(problems[r] == "");
    }
  }
}

TEST_CASE("a process of our uid outside the group cannot plant a descriptor, even knowing the secret",
          "[fd_exchange][trust]") {
  const int world = 3;
  Intruder intruder(world, -1);
  Intruder::Report report;
  const auto outcomes = exchange_with_injection(world, [&](const Invitations& g) { report = intruder.attack(g); });
  INFO("datagrams the intruder queued: " << report.queued);
  CHECK(report.queued > 0);  // the attack reached the sockets: the test means something
  check_every_rank_got_the_genuine_descriptors(outcomes);
}

TEST_CASE("a process of another uid reaches no socket and squats no name, even knowing the paths and the secret",
          "[fd_exchange][trust]") {
  if (geteuid() != 0) {
    WARN("skipped: switching a forked intruder to uid 65534 needs root (the CI and the GPU machine run as root)");
    return;
  }
  const int world = 3;
  Intruder other_uid(world, 65534);
  Intruder same_uid(world, -1);
  Intruder::Report other, same;
  const auto outcomes = exchange_with_injection(world, [&](const Invitations& g) {
    other = other_uid.attack(g);
    same = same_uid.attack(g);
  });
  INFO("datagrams queued: other uid " << other.queued << ", same uid " << same.queued << "; names bound: other uid "
                                      << other.squatted << ", same uid " << same.squatted);
  CHECK(other.queued == 0);    // the private directory stops it before any datagram
  CHECK(other.squatted == 0);  // and it cannot bind a name there
  CHECK(same.queued > 0);      // the paths were right: the test means something
  CHECK(same.squatted == world);
  check_every_rank_got_the_genuine_descriptors(outcomes);
}

TEST_CASE("every rank's socket lives in a private directory, removed when the exchange ends", "[fd_exchange][trust]") {
  const int world = 2;
  std::vector<std::string> paths;
  std::vector<unsigned> modes;
  const auto outcomes = exchange_with_injection(world, [&](const Invitations& g) {
    for (const wire::Invitation& i : g) {
      std::string path(i.path, strnlen(i.path, sizeof(i.path)));
      paths.push_back(path);
      struct stat st {};
      const std::string dir = path.substr(0, path.rfind('/'));
      modes.push_back(lstat(dir.c_str(), &st) == 0 && st.st_uid == geteuid() ? st.st_mode & 07777 : 0xFFFF);
    }
  });
  check_every_rank_got_the_genuine_descriptors(outcomes);
  REQUIRE(paths.size() == static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << paths[r]);
    CHECK(modes[r] == 0700);
    CHECK(paths[r].find("/moe_ep-") != std::string::npos);
    struct stat st {};
    CHECK(lstat(paths[r].c_str(), &st) != 0);                                 // the socket file is gone
    CHECK(lstat(paths[r].substr(0, paths[r].rfind('/')).c_str(), &st) != 0);  // and its directory
  }
  CHECK(paths[0] != paths[1]);
}

TEST_CASE("closing a stranger's descriptor can block: the lingering socket the next cases send is real",
          "[fd_exchange][trust]") {
  int listener = -1;
  const int lingering = lingering_socket(1, &listener);
  REQUIRE(lingering >= 0);
  const auto start = std::chrono::steady_clock::now();
  close(lingering);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(listener);
  CHECK(seconds > 0.8);  // close() waited for its linger time (1 s)
}

TEST_CASE("a stranger's lingering descriptor never delays the exchange past timeout_ms", "[fd_exchange][trust]") {
  // The datagrams are queued before any genuine one, so every rank receives
  // (and must close) the stranger's socket during the exchange.
  const int world = 3;
  const int timeout_ms = 1000;
  Intruder stranger(world, -1, Payload::kLingering);
  Intruder::Report report;
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = exchange_with_injection(
      world, [&](const Invitations& g) { report = stranger.attack(g); }, nullptr, timeout_ms);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("datagrams queued: " << report.queued << "; the exchange took " << seconds << " s in all");
  CHECK(report.queued > 0);
  check_every_rank_got_the_genuine_descriptors(outcomes);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << " took " << outcomes[r].seconds << " s");
    CHECK(outcomes[r].seconds < timeout_ms / 1000.0 + 0.5);
  }
  CHECK(seconds < timeout_ms / 1000.0 + 0.5);
}

TEST_CASE("a stranger flooding lingering descriptors costs at most timeout_ms, on every rank", "[fd_exchange][trust]") {
  // It keeps sending until the test ends: the drain meets datagrams for ever
  // and the socket is closed with some still queued.
  const int world = 2;
  const int timeout_ms = 1000;
  Intruder stranger(world, -1, Payload::kLingering, true);
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes = exchange_with_injection(
      world, [&](const Invitations& g) { stranger.attack(g); }, nullptr, timeout_ms);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("the exchange took " << seconds << " s in all");
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << " took " << outcomes[r].seconds << " s: " << outcomes[r].error);
    // It may succeed (genuine datagrams got through) or fail with BOOTSTRAP
    // (the flood kept them out), but within the bound either way.
    CHECK((outcomes[r].status == MOE_EP_SUCCESS || outcomes[r].status == MOE_EP_ERROR_BOOTSTRAP));
    CHECK(outcomes[r].seconds < timeout_ms / 1000.0 + 0.5);
  }
  CHECK(seconds < timeout_ms / 1000.0 + 0.5);
}

TEST_CASE("a duplicate message from a group member fails the exchange on every rank", "[fd_exchange][trust]") {
  // Ranks are threads of this process, so a message sent from here carries a
  // member's credentials: rank 0 takes it as rank 1's, then rejects the real one.
  const int world = 3;
  const int decoy = memfd_holding(0xD0);
  const auto outcomes = exchange_with_injection(world, [&](const Invitations& g) {
    const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(send_claim(sock, g, 0, 1, {decoy}));
    close(sock);
  });
  close(decoy);
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].status == MOE_EP_ERROR_BOOTSTRAP);
  }
  CHECK(outcomes[0].error.find("a second descriptor from rank 1") != std::string::npos);
  CHECK(outcomes[1].error.find("rank 0 failed") != std::string::npos);
  CHECK(outcomes[2].error.find("rank 0 failed") != std::string::npos);
}

TEST_CASE("a malformed message from a group member fails the exchange on every rank", "[fd_exchange][trust]") {
  const int world = 2;
  const int a = memfd_holding(0xA), b = memfd_holding(0xB);
  const auto outcomes = exchange_with_injection(world, [&](const Invitations& g) {
    const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(send_claim(sock, g, 1, 0, {a, b}));  // two descriptors where one belongs
    close(sock);
  });
  close(a);
  close(b);
  CHECK(outcomes[0].status == MOE_EP_ERROR_BOOTSTRAP);
  CHECK(outcomes[1].status == MOE_EP_ERROR_BOOTSTRAP);
  CHECK(outcomes[1].error.find("unexpected message") != std::string::npos);
  CHECK(outcomes[0].error.find("rank 1 failed") != std::string::npos);
}

TEST_CASE("ranks of different users are refused before any socket is bound, on every rank", "[fd_exchange][trust]") {
  const int world = 3;
  const auto outcomes = exchange_with_injection(
      world, [](const Invitations&) {}, [](wire::Invitation* all) { all[2].uid += 1; });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].status == MOE_EP_ERROR_UNSUPPORTED);
    CHECK(outcomes[r].error.find("rank 2 runs as uid") != std::string::npos);
  }
}

TEST_CASE("a socket path a peer publishes unterminated, relative or empty fails the exchange on every rank",
          "[fd_exchange][trust]") {
  const int world = 2;
  for (int variant = 0; variant < 3; ++variant) {
    const auto outcomes = exchange_with_injection(
        world, [](const Invitations&) {},
        [variant](wire::Invitation* all) {
          if (variant == 0) std::memset(all[1].path, 'A', sizeof(all[1].path));  // no NUL
          if (variant == 1) std::strcpy(all[1].path, "relative/s");
          if (variant == 2) all[1].path[0] = '\0';
        });
    for (int r = 0; r < world; ++r) {
      INFO("variant " << variant << ", rank " << r << ": " << outcomes[r].error);
      CHECK(outcomes[r].status == MOE_EP_ERROR_INVALID_INPUT);
      CHECK(outcomes[r].error.find("rank 1 published no usable socket path") != std::string::npos);
    }
  }
}

namespace {

// The exchange of a rejoin as the store gives it: `world` ranks of which only
// `participants` take part; the non-participants' slots of every allgather
// are zeros.  Runs over a thread bootstrap of the participants alone.
class SubgroupExchange final : public moe_ep::Exchange {
 public:
  SubgroupExchange(const moe_ep::Bootstrap& inner, std::vector<int> participants, int world)
      : inner_(inner), participants_(std::move(participants)), world_(world) {}
  int32_t rank() const override { return participants_[static_cast<size_t>(inner_.rank())]; }
  int32_t world_size() const override { return world_; }

 protected:
  void do_allgather(const void* send, void* recv, size_t bytes, const char* step) const override {
    std::vector<char> sub(bytes * participants_.size());
    inner_.allgather(send, sub.data(), bytes, step);
    std::memset(recv, 0, bytes * static_cast<size_t>(world_));
    for (size_t i = 0; i < participants_.size(); ++i) {
      std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(participants_[i]) * bytes, sub.data() + i * bytes,
                  bytes);
    }
  }

 private:
  const moe_ep::Bootstrap& inner_;
  std::vector<int> participants_;
  int world_;
};

// Ranks 0, 1 and 3 of 4 take part, rank 3 joins (rank 2 stays out): what
// each participant received, or its error.
std::vector<RankOutcome> rejoin_exchange(std::function<void(const Invitations&)> inject) {
  const std::vector<int> participants = {0, 1, 3};
  const int world = 4;
  moe_ep::HandlePeers peers;
  peers.participants = {1, 1, 0, 1};
  peers.joining = {0, 0, 0, 1};
  std::vector<RankOutcome> outcomes(world);
  std::vector<int> genuine(world);
  for (int r = 0; r < world; ++r) genuine[r] = memfd_holding(1000 + r);
  moe_ep_test::run_ranks(int(participants.size()), [&](int sub, const moe_ep_bootstrap_t& b) {
    InjectingBootstrap spy;
    spy.inner = b;
    spy.inject = &inject;
    const moe_ep_bootstrap_t viewed = spy.view();
    const moe_ep::Bootstrap bootstrap(&viewed);
    const SubgroupExchange exchange(bootstrap, participants, world);
    const int rank = exchange.rank();
    RankOutcome& out = outcomes[rank];
    try {
      std::vector<moe_ep::UniqueFd> fds = moe_ep::exchange_fds(exchange, genuine[rank], 5000, peers);
      for (int r = 0; r < world; ++r) {
        const bool wanted = peers.wants(rank, r);
        if (wanted != fds[r].valid()) {
          out.problems += (wanted ? "nothing from rank " : "a descriptor from rank ") + std::to_string(r) + "; ";
        } else if (wanted && value_in(fds[r].get()) != 1000 + r) {
          out.problems += "a foreign descriptor as rank " + std::to_string(r) + "; ";
        }
      }
    } catch (const moe_ep::Error& e) {
      out.status = e.status();
      out.error = e.what();
    }
  });
  for (int fd : genuine) close(fd);
  return outcomes;
}

}  // namespace

TEST_CASE("at a rejoin the joining rank gets every participant's descriptor, the others only the joining rank's",
          "[fd_exchange]") {
  moe_ep::HandlePeers p;
  p.participants = {1, 1, 0, 1};
  p.joining = {0, 0, 0, 1};
  CHECK(p.wants(3, 0));
  CHECK(p.wants(0, 3));
  CHECK_FALSE(p.wants(0, 1));  // members hold each other's already
  CHECK_FALSE(p.wants(3, 2));  // rank 2 takes no part
  CHECK_FALSE(p.wants(3, 3));
  const auto outcomes = rejoin_exchange([](const Invitations&) {});
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].error == "");
    CHECK(outcomes[r].problems == "");
  }
}

TEST_CASE("at a rejoin a descriptor between two members is unexpected and fails the exchange on every participant",
          "[fd_exchange][trust]") {
  // From this process (a member's credentials) to rank 1 (the subgroup's
  // second rank), claiming rank 0, whose descriptor rank 1 already holds.
  const int decoy = memfd_holding(0xD0);
  const auto outcomes = rejoin_exchange([&](const Invitations& g) {
    const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHECK(send_claim(sock, g, 1, 0, {decoy}));
    close(sock);
  });
  close(decoy);
  for (int r : {0, 1, 3}) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].status == MOE_EP_ERROR_BOOTSTRAP);
  }
  CHECK(outcomes[1].error.find("unexpected message") != std::string::npos);
  CHECK(outcomes[0].error.find("rank 1 failed") != std::string::npos);
}
