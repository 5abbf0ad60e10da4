// The shutdown after a timeout, under mpiexec with 2 or more ranks: rank 0
// creates a HOST handle while its peers stall, gets TIMEOUT, and its create's
// exchange is left running inside MPI_Allgather on an abandoned thread.
// moe_ep_mpi_bootstrap_release must then refuse (INVALID_STATE, nothing
// freed) instead of freeing the communicator under that collective.  The
// peers then catch up (they join the very allgather rank 0's thread is in),
// the callback returns, release succeeds, and MPI_Finalize neither crashes
// nor hangs.  Several rounds, all ranks oversubscribed: under load.
//
// Its own main: the callbacks run on the handle's thread while the main
// thread makes MPI calls too, so MPI must be initialised with
// MPI_THREAD_MULTIPLE (exit code 77, skipped, where the library offers less).
// One line per finding; exit code 1 on any rank fails the test.
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "moe_ep_c.h"
#include "moe_ep_mpi.h"
#include "test_params.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRounds = 4;
constexpr int32_t kTimeoutMs = 300;
constexpr uint64_t kBarrier = UINT64_MAX;  // the call in flight was a barrier

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Forwards to the MPI adapter and remembers the size of the latest call, so
// that the peers can join exactly the collective rank 0's thread waits in.
struct Spy {
  moe_ep_bootstrap_t inner{};
  std::atomic<uint64_t> last_bytes{0};

  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes) {
    auto* self = static_cast<Spy*>(ctx);
    self->last_bytes = bytes;
    return self->inner.allgather(self->inner.ctx, send, recv, bytes);
  }
  static int32_t barrier(void* ctx) {
    auto* self = static_cast<Spy*>(ctx);
    self->last_bytes = kBarrier;
    return self->inner.barrier(self->inner.ctx);
  }
  moe_ep_bootstrap_t view() {
    moe_ep_bootstrap_t b = inner;
    b.ctx = this;
    b.allgather = &Spy::allgather;
    b.barrier = &Spy::barrier;
    return b;
  }
};

int g_failures = 0;
int g_rank = 0;
// With MOE_EP_TEST_GPU_BACKEND=nvlink, rank 0 creates an NVLINK_TWO_SIDED
// handle on GPU 0 instead of a HOST one: the same abandoned exchange, on the
// backend whose create also runs its agreement steps on that thread.
bool g_nvlink = false;

void check(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::printf("FAIL rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
}

// Rank 0's side of one round.
void survivor(int round) {
  moe_ep_bootstrap_t b;
  MPI_Comm world = MPI_COMM_WORLD;
  check(moe_ep_mpi_bootstrap_init(&world, &b, sizeof b) == MOE_EP_SUCCESS, "init");
  Spy spy;
  spy.inner = b;
  const moe_ep_bootstrap_t viewed = spy.view();
  moe_ep_params_t p = moe_ep_test::make_params(2 * b.world_size, 2, 4, 8);
  moe_ep_config_t c = moe_ep_test::host_config();
  if (g_nvlink) {
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.device = 0;
  }
  c.timeout_ms = kTimeoutMs;
  moe_ep_handle_t h = nullptr;
  const auto t0 = Clock::now();
  const moe_ep_status_t created = moe_ep_create(&viewed, &p, &c, &h);
  const double create_s = seconds_since(t0);
  check(created == MOE_EP_ERROR_TIMEOUT, "round " + std::to_string(round) + ": create returned " +
                                             std::to_string(created) + " (" + moe_ep_last_error() +
                                             "), expected TIMEOUT while the peers stall");
  check(create_s < kTimeoutMs / 1000.0 + 1.5, "create took " + std::to_string(create_s) + " s");
  if (h != nullptr) moe_ep_destroy(&h);

  const moe_ep_status_t refused = moe_ep_mpi_bootstrap_release(&b);
  const std::string message = moe_ep_last_error();
  check(refused == MOE_EP_ERROR_INVALID_STATE,
        "release while the abandoned callback runs returned " + std::to_string(refused) + ", expected INVALID_STATE");
  check(message.find("expected no callback running on this bootstrap, got 1") != std::string::npos,
        "release's message: " + message);
  check(b.ctx != nullptr && b.allgather != nullptr, "a refused release must leave the bootstrap as it was");

  uint64_t in_flight = spy.last_bytes;
  MPI_Bcast(&in_flight, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);  // the peers now catch up

  const auto t1 = Clock::now();
  moe_ep_status_t released = refused;
  while (released != MOE_EP_SUCCESS && seconds_since(t1) < 10.0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    released = moe_ep_mpi_bootstrap_release(&b);
  }
  check(released == MOE_EP_SUCCESS,
        "release did not succeed within 10 s of the peers catching up: " + std::string(moe_ep_last_error()));
  if (released != MOE_EP_SUCCESS) {
    std::printf("rank 0: aborting, as the documentation says after a refused release\n");
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::printf("round %d: create TIMEOUT after %.3f s, release refused, then released %.3f s after the peers came\n",
              round, create_s, seconds_since(t1));
}

// A stalled peer's side: it never creates, then joins the collective that
// rank 0's abandoned thread is in.
void late_peer() {
  moe_ep_bootstrap_t b;
  MPI_Comm world = MPI_COMM_WORLD;
  check(moe_ep_mpi_bootstrap_init(&world, &b, sizeof b) == MOE_EP_SUCCESS, "init");
  uint64_t in_flight = 0;
  MPI_Bcast(&in_flight, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (in_flight == kBarrier) {
    check(b.barrier(b.ctx) == 0, "the matching barrier");
  } else {
    std::vector<unsigned char> send(in_flight), recv(in_flight * b.world_size);
    check(b.allgather(b.ctx, send.data(), recv.data(), in_flight) == 0, "the matching allgather");
  }
  check(moe_ep_mpi_bootstrap_release(&b) == MOE_EP_SUCCESS, "release on a peer");
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (provided < MPI_THREAD_MULTIPLE || world < 2) {
    if (g_rank == 0) {
      std::printf("skipped: needs 2 or more ranks and MPI_THREAD_MULTIPLE (got %d ranks, thread level %d)\n", world,
                  provided);
    }
    MPI_Finalize();
    return 77;
  }
  const char* backend = std::getenv("MOE_EP_TEST_GPU_BACKEND");
  g_nvlink = backend != nullptr && std::string(backend) == "nvlink";
  int32_t gpu = 0;
  if (g_nvlink && g_rank == 0 && moe_ep_is_platform_supported(0, &gpu) != MOE_EP_SUCCESS) gpu = 0;
  MPI_Bcast(&gpu, 1, MPI_INT32_T, 0, MPI_COMM_WORLD);
  if (g_nvlink && !gpu) {
    if (g_rank == 0) std::printf("skipped: MOE_EP_TEST_GPU_BACKEND=nvlink needs GPU 0 usable by that backend\n");
    MPI_Finalize();
    return 77;
  }
  for (int round = 0; round < kRounds; ++round) {
    if (g_rank == 0) {
      survivor(round);
    } else {
      late_peer();
    }
    MPI_Barrier(MPI_COMM_WORLD);
  }
  int failed = g_failures > 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const auto t0 = Clock::now();
  MPI_Finalize();
  if (g_rank == 0) std::printf("MPI_Finalize returned after %.3f s; %s\n", seconds_since(t0), any ? "FAILED" : "ok");
  return any ? 1 : 0;
}
