// libFuzzer target of the fd exchange's receive side (NVLINK_TWO_SIDED
// create): a group of 2 or 3 thread ranks exchanges memfds, and before any
// genuine message the input's datagrams are queued in the ranks' sockets:
// any length (0 to 96 bytes), any claimed rank, the group's secret or not,
// 0 to 4 descriptors.  They are sent from this process, so they carry a
// group member's credentials and reach the checks that only members reach.
// Every rank must then either succeed holding exactly the genuine
// descriptors, or fail with BOOTSTRAP or INVALID_INPUT; anything else, a
// crash or a sanitizer report, is a bug.  Built by -DMOE_EP_BUILD_FUZZER=ON.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "error.hpp"
#include "nvlink/fd_exchange.hpp"
#include "thread_bootstrap.hpp"

namespace {

namespace wire = moe_ep::fd_exchange_wire;

struct Crafted {
  int target = 0;
  int32_t claimed = 0;
  bool right_secret = false;
  std::vector<unsigned char> bytes;
  int fds = 0;
};

int memfd_holding(int value) {
  const int fd = memfd_create("moe_ep_fuzz", MFD_CLOEXEC);
  if (fd < 0 || write(fd, &value, sizeof(value)) != static_cast<ssize_t>(sizeof(value))) std::abort();
  return fd;
}

int value_in(int fd) {
  int v = -1;
  return pread(fd, &v, sizeof(v), 0) == static_cast<ssize_t>(sizeof(v)) ? v : -2;
}

void send_crafted(const std::vector<wire::Invitation>& group, const Crafted& c, int decoy) {
  sockaddr_un addr{};
  socklen_t length = 0;
  if (!wire::socket_address(group[c.target], &addr, &length)) return;
  std::vector<unsigned char> payload = c.bytes;
  if (payload.size() >= sizeof(wire::Message)) {  // a message-shaped prefix: secret and claimed rank
    wire::Message m{};
    if (c.right_secret) m.secret = group[0].secret;
    m.rank = c.claimed;
    std::memcpy(payload.data(), &m, sizeof(m));
  }
  iovec iov{payload.data(), payload.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_name = &addr;
  msg.msg_namelen = length;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (c.fds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * c.fds);
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * c.fds);
    for (int i = 0; i < c.fds; ++i) std::memcpy(CMSG_DATA(h) + i * sizeof(int), &decoy, sizeof(int));
  }
  const int sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sendmsg(sock, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  close(sock);
}

// Forwards to the thread bootstrap; after the allgather that follows the
// invitations, rank 0 queues the crafted datagrams while the others wait.
struct Injector {
  moe_ep_bootstrap_t inner{};
  const std::vector<Crafted>* crafted = nullptr;
  int decoy = -1;
  std::vector<wire::Invitation> group;
  int stage = 0;

  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes) {
    auto* self = static_cast<Injector*>(ctx);
    const int32_t rc = self->inner.allgather(self->inner.ctx, send, recv, bytes);
    if (rc != 0) return rc;
    if (self->stage == 0 && bytes == sizeof(wire::Invitation)) {
      auto* all = static_cast<wire::Invitation*>(recv);
      self->group.assign(all, all + self->inner.world_size);
      self->stage = 1;
    } else if (self->stage == 1) {
      self->stage = 2;
      if (self->inner.rank == 0) {
        for (const Crafted& c : *self->crafted) send_crafted(self->group, c, self->decoy);
      }
      return self->inner.barrier(self->inner.ctx);
    }
    return 0;
  }
  static int32_t barrier(void* ctx) {
    auto* self = static_cast<Injector*>(ctx);
    return self->inner.barrier(self->inner.ctx);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int world = in.ConsumeIntegralInRange<int>(2, 3);
  std::vector<Crafted> crafted(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (Crafted& c : crafted) {
    c.target = in.ConsumeIntegralInRange<int>(0, world - 1);
    c.claimed = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(-1, world) : in.ConsumeIntegral<int32_t>();
    c.right_secret = in.ConsumeBool();
    c.fds = in.ConsumeIntegralInRange<int>(0, 4);
    c.bytes = in.ConsumeBytes<unsigned char>(in.ConsumeIntegralInRange<size_t>(0, 96));
  }
  const int decoy = memfd_holding(0xBAD);
  std::vector<int> genuine(world);
  for (int r = 0; r < world; ++r) genuine[r] = memfd_holding(1000 + r);
  std::vector<std::string> problems(world);
  moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    Injector spy;
    spy.inner = b;
    spy.crafted = &crafted;
    spy.decoy = decoy;
    moe_ep_bootstrap_t viewed = b;
    viewed.ctx = &spy;
    viewed.allgather = &Injector::allgather;
    viewed.barrier = &Injector::barrier;
    const moe_ep::Bootstrap bootstrap(&viewed);
    try {
      std::vector<moe_ep::UniqueFd> fds = moe_ep::exchange_fds(bootstrap, genuine[rank], 5000);
      for (int r = 0; r < world; ++r) {
        if (r != rank && (!fds[r].valid() || value_in(fds[r].get()) != 1000 + r)) {
          problems[rank] += "a wrong descriptor as rank " + std::to_string(r) + "; ";
        }
      }
    } catch (const moe_ep::Error& e) {
      if (e.status() != MOE_EP_ERROR_BOOTSTRAP && e.status() != MOE_EP_ERROR_INVALID_INPUT) {
        problems[rank] += std::string("unexpected status: ") + e.what();
      }
    }
  });
  for (int fd : genuine) close(fd);
  close(decoy);
  for (const std::string& p : problems) {
    if (!p.empty()) {
      std::fprintf(stderr, "fd exchange: %s\n", p.c_str());
      std::abort();
    }
  }
  return 0;
}
