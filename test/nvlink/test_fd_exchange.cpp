// The AF_UNIX SCM_RIGHTS exchange that shares workspace handles between the
// ranks of one host, tested without a GPU: ranks are threads, and each passes
// a memfd holding its rank, so a received descriptor proves where it came from.
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "nvlink/fd_exchange.hpp"
#include "thread_bootstrap.hpp"

namespace {

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
