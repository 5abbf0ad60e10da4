// A rank killed with SIGKILL in the middle of a dispatch: the survivor must
// get TIMEOUT within timeout_ms + 1 s, with a message naming the phase and the
// dead rank, its destroy must complete, and a fresh group must then create a
// handle and run a round.  Two processes (forked before any CUDA call, one
// GPU each, or both on one GPU where there is only one: the NVLink backend
// serves ranks that share a GPU) share a bootstrap in shared memory: unlike
// mpiexec, nothing here tears the survivor down when its peer dies.  Exits 77
// (skipped) without a usable GPU; prints one line per finding.
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "hold_kernel.hpp"
#include "moe_ep_c.h"
#include "workload.hpp"

namespace {

constexpr int kWorld = 2;
constexpr int kTimeoutMs = 2000;
constexpr size_t kMaxGather = 1 << 16;
constexpr int kSkipped = 77;

// The bootstrap of one group of forked ranks.
struct SharedGroup {
  pthread_barrier_t barrier;
  unsigned char area[kWorld][kMaxGather];
};

struct RankBootstrap {
  SharedGroup* group;
  int rank;
};

int32_t shared_barrier(void* ctx) {
  pthread_barrier_wait(&static_cast<RankBootstrap*>(ctx)->group->barrier);
  return 0;
}

int32_t shared_allgather(void* ctx, const void* send, void* recv, size_t bytes) {
  auto* b = static_cast<RankBootstrap*>(ctx);
  if (bytes > kMaxGather) return -1;
  shared_barrier(ctx);
  std::memcpy(b->group->area[b->rank], send, bytes);
  shared_barrier(ctx);
  for (int r = 0; r < kWorld; ++r) std::memcpy(static_cast<char*>(recv) + r * bytes, b->group->area[r], bytes);
  shared_barrier(ctx);
  return 0;
}

SharedGroup* new_group() {
  void* p = mmap(nullptr, sizeof(SharedGroup), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* g = static_cast<SharedGroup*>(p);
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&g->barrier, &attr, kWorld);
  return g;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// One rank's handle and device buffers for 32 tokens of top-8 of 64 experts.
struct Rank {
  static constexpr int kTokens = 32, kTopK = 8, kExperts = 64, kHidden = 1024;
  moe_ep_handle_t h = nullptr;
  void* hidden = nullptr;
  int32_t* ids = nullptr;
  void* expert_output = nullptr;
  int device = 0;
  int64_t hidden_shape[2] = {kTokens, kHidden}, ids_shape[2] = {kTokens, kTopK};
  int64_t expert_shape[2] = {kWorld * kTokens, kHidden};

  moe_ep_status_t create(const moe_ep_bootstrap_t& b) {
    moe_ep_params_t p = moe_ep_verify::required_params(kExperts, kTopK, kTokens, kHidden);  // bf16 both ways
    moe_ep_config_t c;
    moe_ep_config_init(&c, sizeof c);
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.timeout_ms = kTimeoutMs;
    c.device = device;
    if (cudaMalloc(&hidden, kTokens * kHidden * 2) != cudaSuccess ||
        cudaMalloc(reinterpret_cast<void**>(&ids), kTokens * kTopK * 4) != cudaSuccess ||
        cudaMalloc(&expert_output, kWorld * kTokens * kHidden * 2) != cudaSuccess) {
      return MOE_EP_ERROR_CUDA;
    }
    std::vector<int32_t> routing(kTokens * kTopK);
    for (int t = 0; t < kTokens; ++t) {
      for (int k = 0; k < kTopK; ++k) routing[t * kTopK + k] = (t * 7 + k * 8) % kExperts;  // both ranks
    }
    cudaMemcpy(ids, routing.data(), routing.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(hidden, 0, kTokens * kHidden * 2);
    cudaMemset(expert_output, 0, kWorld * kTokens * kHidden * 2);
    return moe_ep_create(&b, &p, &c, &h);
  }
  moe_ep_tensor_t tensor(void* data, moe_ep_dtype_t dtype, int64_t* shape) const {
    moe_ep_tensor_t t{};
    t.data = data;
    t.device = moe_ep_device_t{MOE_EP_DEVICE_CUDA, device};
    t.ndim = 2;
    t.dtype = dtype;
    t.shape = shape;
    return t;
  }
  moe_ep_status_t dispatch(cudaStream_t stream) {
    moe_ep_tensor_t th = tensor(hidden, moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}, hidden_shape);
    moe_ep_tensor_t ti = tensor(ids, moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}, ids_shape);
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a, sizeof a);
    a.hidden_states = &th;
    a.topk_ids = &ti;
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    return moe_ep_dispatch(h, &a, &r, stream);
  }
  moe_ep_status_t combine(cudaStream_t stream) {
    moe_ep_tensor_t te = tensor(expert_output, moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}, expert_shape);
    moe_ep_combine_result_t r;
    moe_ep_combine_result_init(&r, sizeof r);
    return moe_ep_combine(h, &te, nullptr, &r, stream);
  }
  moe_ep_status_t poll(std::string* message) {
    moe_ep_status_t s = MOE_EP_SUCCESS;
    if (moe_ep_get_async_error(h, &s) != MOE_EP_SUCCESS) return MOE_EP_ERROR_INTERNAL;
    *message = s != MOE_EP_SUCCESS ? moe_ep_last_error() : "";
    return s;
  }
};

int usable_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  int usable = 0;
  for (int d = 0; d < count; ++d) {
    int32_t ok = 0;
    if (moe_ep_is_platform_supported(d, &ok) == MOE_EP_SUCCESS && ok) ++usable;
  }
  return usable;
}

// The GPU of `rank`: its own where there are enough, else shared.
int rank_device(int rank) { return rank % usable_gpus(); }

// This rank's bootstrap over the shared group.
moe_ep_bootstrap_t shared_bootstrap(RankBootstrap* ctx) {
  moe_ep_bootstrap_t b;
  moe_ep_bootstrap_init(&b, sizeof b);
  b.rank = ctx->rank;
  b.world_size = kWorld;
  b.ctx = ctx;
  b.allgather = shared_allgather;
  b.barrier = shared_barrier;
  return b;
}

// Rank body of the kill round.  Rank 1 queues its dispatch behind a held
// stream and SIGKILLs itself: its dispatch was issued and never ran.
int kill_round_rank(SharedGroup* group, int rank) {
  if (usable_gpus() < 1) return kSkipped;
  RankBootstrap ctx{group, rank};
  const moe_ep_bootstrap_t b = shared_bootstrap(&ctx);
  Rank me;
  me.device = rank_device(rank);
  cudaSetDevice(me.device);
  if (me.create(b) != MOE_EP_SUCCESS) {
    std::printf("rank %d: create failed: %s\n", rank, moe_ep_last_error());
    return 1;
  }
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::string m;
  if (me.dispatch(stream) != MOE_EP_SUCCESS || me.combine(stream) != MOE_EP_SUCCESS || me.poll(&m) != MOE_EP_SUCCESS) {
    std::printf("rank %d: the good round failed: %s\n", rank, m.c_str());
    return 1;
  }
  shared_barrier(&ctx);  // the last collective step: after this the ranks part
  if (rank == 1) {
    int* release = nullptr;
    int* release_device = nullptr;
    cudaHostAlloc(reinterpret_cast<void**>(&release), sizeof(int), cudaHostAllocMapped);
    *release = 0;
    cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_device), release, 0);
    moe_ep_test::launch_hold(stream, release_device, 30000000000LL);
    me.dispatch(stream);  // queued behind the hold: issued, never run
    std::fflush(stdout);
    raise(SIGKILL);
  }
  const auto start = std::chrono::steady_clock::now();
  const moe_ep_status_t dispatched = me.dispatch(stream);
  const moe_ep_status_t polled = me.poll(&m);
  const double seconds = seconds_since(start);
  const bool named = m.find("dispatch waiting for rank 1") != std::string::npos;
  std::printf("survivor: dispatch %s, poll %s after %.3f s (timeout_ms %d): '%s'\n",
              moe_ep_status_string(dispatched), moe_ep_status_string(polled), seconds, kTimeoutMs, m.c_str());
  const auto destroy_start = std::chrono::steady_clock::now();
  moe_ep_destroy(&me.h);
  const double destroy_seconds = seconds_since(destroy_start);
  std::printf("survivor: destroy completed in %.3f s\n", destroy_seconds);
  const bool ok = dispatched == MOE_EP_SUCCESS && polled == MOE_EP_ERROR_TIMEOUT && named &&
                  seconds <= kTimeoutMs / 1000.0 + 1.0 && destroy_seconds < 5.0;
  return ok ? 0 : 1;
}

// A fresh group after the kill: create and one good round on both ranks.
int fresh_group_rank(SharedGroup* group, int rank) {
  RankBootstrap ctx{group, rank};
  const moe_ep_bootstrap_t b = shared_bootstrap(&ctx);
  Rank me;
  me.device = rank_device(rank);
  cudaSetDevice(me.device);
  std::string m;
  const moe_ep_status_t created = me.create(b);
  const bool ok = created == MOE_EP_SUCCESS && me.dispatch(nullptr) == MOE_EP_SUCCESS &&
                  me.combine(nullptr) == MOE_EP_SUCCESS && me.poll(&m) == MOE_EP_SUCCESS;
  std::printf("fresh group rank %d: create %s, round %s\n", rank, moe_ep_status_string(created),
              ok ? "ok" : moe_ep_last_error());
  moe_ep_destroy(&me.h);
  return ok ? 0 : 1;
}

// Forks the ranks of one group, each running `body`, and collects how each ended.
std::vector<int> run_group(int (*body)(SharedGroup*, int)) {
  SharedGroup* group = new_group();
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      alarm(120);  // a hung rank ends the probe rather than the job
      std::_Exit(body(group, r));
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    statuses.push_back(status);
  }
  munmap(group, sizeof(SharedGroup));
  return statuses;
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::vector<int> kill = run_group(kill_round_rank);
  if (WIFEXITED(kill[0]) && WEXITSTATUS(kill[0]) == kSkipped) {
    std::printf("skipped: needs a GPU usable by the NVLINK_TWO_SIDED backend\n");
    return kSkipped;
  }
  const bool survivor_ok = WIFEXITED(kill[0]) && WEXITSTATUS(kill[0]) == 0;
  const bool killed = WIFSIGNALED(kill[1]) && WTERMSIG(kill[1]) == SIGKILL;
  std::printf("kill round: rank 1 %s, survivor %s\n", killed ? "died of SIGKILL" : "did NOT die of SIGKILL",
              survivor_ok ? "passed" : "FAILED");
  const std::vector<int> fresh = run_group(fresh_group_rank);
  bool fresh_ok = true;
  for (int s : fresh) fresh_ok = fresh_ok && WIFEXITED(s) && WEXITSTATUS(s) == 0;
  std::printf("fresh group: %s\n", fresh_ok ? "passed" : "FAILED");
  const bool ok = survivor_ok && killed && fresh_ok;
  std::printf("kill_peer_probe: %s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
