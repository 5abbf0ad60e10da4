// The AF_UNIX SCM_RIGHTS exchange that shares workspace handles between the
// ranks of one host, tested without a GPU: ranks are threads, and each passes
// a memfd holding its rank, so a received descriptor proves where it came from.
//
// The intruder cases play a local attacker who knows everything, the socket
// names and even the group's secret, and injects datagrams carrying its own
// descriptors and claiming to be a rank, queued in every rank's socket before
// any genuine message: a process of another uid (needs root to switch uid), and
// a process of our uid that is not in the group.  Only the kernel-checked
// credentials tell them apart, and the exchange must keep only the genuine
// descriptors (compared by device and inode).
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <functional>
#include <string>
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

// Sends one message claiming `claimed_rank`, with `fds`, to `target`'s socket.
bool send_claim(int sock, const wire::Invitation& group, int target, int32_t claimed_rank,
                const std::vector<int>& fds) {
  socklen_t length = 0;
  sockaddr_un addr = wire::socket_address(group.name, target, &length);
  wire::Message m{group.secret, claimed_rank};
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

// A forked process (of another uid when `uid` >= 0) that waits for the
// group's invitation on a pipe, then queues datagrams claiming every rank in
// every rank's socket, each with its own memfd, and reports how many got in.
class Intruder {
 public:
  Intruder(int world, int uid) {
    int go[2], done[2];
    REQUIRE(pipe(go) == 0);
    REQUIRE(pipe(done) == 0);
    pid_ = fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      close(go[1]);
      close(done[0]);
      _exit(run(world, uid, go[0], done[1]));
    }
    close(go[0]);
    close(done[1]);
    go_ = go[1];
    done_ = done[0];
  }
  ~Intruder() {
    if (go_ >= 0) close(go_);  // a child still waiting reads EOF and leaves
    if (done_ >= 0) close(done_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  // Lets it loose with the group's invitation; returns the datagrams queued (-1: it failed).
  int attack(const wire::Invitation& group) {
    if (write(go_, &group, sizeof(group)) != static_cast<ssize_t>(sizeof(group))) return -1;
    int queued = -1;
    if (read(done_, &queued, sizeof(queued)) != static_cast<ssize_t>(sizeof(queued))) return -1;
    return queued;
  }

  static constexpr int kValue = 0xBAD;

 private:
  static int run(int world, int uid, int go, int done) {
    if (uid >= 0) {
      if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) return 2;
    }
    const int mine = memfd_holding(kValue);
    const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (mine < 0 || sock < 0) return 3;
    wire::Invitation group{};
    if (read(go, &group, sizeof(group)) != static_cast<ssize_t>(sizeof(group))) return 0;  // not needed
    int queued = 0;
    for (int target = 0; target < world; ++target) {
      for (int claimed = 0; claimed < world; ++claimed) {
        if (claimed != target && send_claim(sock, group, target, claimed, {mine})) ++queued;
      }
    }
    return write(done, &queued, sizeof(queued)) == static_cast<ssize_t>(sizeof(queued)) ? 0 : 4;
  }

  pid_t pid_ = -1;
  int go_ = -1;
  int done_ = -1;
};

// A bootstrap that forwards to the thread bootstrap and, once every rank has
// bound its socket (the allgather after the one that carried the invitation),
// lets rank 0 run `inject` with the group's invitation while the other ranks
// wait: whatever it queues arrives before any genuine message.
struct InjectingBootstrap {
  moe_ep_bootstrap_t inner{};
  std::function<void(const wire::Invitation&)>* inject = nullptr;
  std::function<void(wire::Invitation*)>* edit_invitations = nullptr;  // what the bootstrap delivers
  wire::Invitation group{};
  int stage = 0;  // 0: before the invitation, 1: invitation seen, 2: injected

  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes) {
    auto* self = static_cast<InjectingBootstrap*>(ctx);
    const int32_t rc = self->inner.allgather(self->inner.ctx, send, recv, bytes);
    if (rc != 0) return rc;
    if (self->stage == 0 && bytes == sizeof(wire::Invitation)) {
      if (self->edit_invitations) (*self->edit_invitations)(static_cast<wire::Invitation*>(recv));
      std::memcpy(&self->group, recv, sizeof(self->group));  // rank 0's name and secret
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
};

// One exchange among `world` thread ranks, with `inject` run by rank 0 once
// every socket is bound.  Checks that every descriptor received is the
// genuine one of its rank (same file, same content).
std::vector<RankOutcome> exchange_with_injection(int world, std::function<void(const wire::Invitation&)> inject,
                                                std::function<void(wire::Invitation*)> edit_invitations = nullptr) {
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
    try {
      std::vector<moe_ep::UniqueFd> fds = moe_ep::exchange_fds(bootstrap, genuine[rank], 10000);
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
  int queued = -1;
  const auto outcomes = exchange_with_injection(world, [&](const wire::Invitation& g) { queued = intruder.attack(g); });
  INFO("datagrams the intruder queued: " << queued);
  CHECK(queued > 0);  // the attack reached the sockets: the test means something
  check_every_rank_got_the_genuine_descriptors(outcomes);
}

TEST_CASE("a process of another uid cannot plant a descriptor, even knowing the secret", "[fd_exchange][trust]") {
  if (geteuid() != 0) {
    WARN("skipped: switching a forked intruder to uid 65534 needs root (the CI and the GPU machine run as root)");
    return;
  }
  const int world = 3;
  Intruder other_uid(world, 65534);
  Intruder same_uid(world, -1);
  int queued_other = -1, queued_same = -1;
  const auto outcomes = exchange_with_injection(world, [&](const wire::Invitation& g) {
    queued_other = other_uid.attack(g);
    queued_same = same_uid.attack(g);
  });
  INFO("datagrams queued: other uid " << queued_other << ", same uid " << queued_same);
  CHECK(queued_other > 0);
  check_every_rank_got_the_genuine_descriptors(outcomes);
}

TEST_CASE("a duplicate message from a group member fails the exchange on every rank", "[fd_exchange][trust]") {
  // Ranks are threads of this process, so a message sent from here carries a
  // member's credentials: rank 0 takes it as rank 1's, then rejects the real one.
  const int world = 3;
  const int decoy = memfd_holding(0xD0);
  const auto outcomes = exchange_with_injection(world, [&](const wire::Invitation& g) {
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
  const auto outcomes = exchange_with_injection(world, [&](const wire::Invitation& g) {
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
      world, [](const wire::Invitation&) {}, [](wire::Invitation* all) { all[2].uid += 1; });
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r << ": " << outcomes[r].error);
    CHECK(outcomes[r].status == MOE_EP_ERROR_UNSUPPORTED);
    CHECK(outcomes[r].error.find("rank 2 runs as uid") != std::string::npos);
  }
}
