// Surviving a dead rank on NVLINK_TWO_SIDED (failure_policy MASK;
// docs/nvlink_backend.md, "Surviving a dead rank"): the scenarios of the HOST
// test (test/support/rank_failure_scenario.hpp) with every rank's tensors on
// a GPU.  4 ranks as forked processes share the machine's GPUs (rank r on
// GPU r % count; on one GPU all four share it, which the backend allows);
// the store runs in a process of its own.  One rank is killed with SIGKILL
// mid-stream, or stalls without dying; the survivors' kernels give up on it
// after timeout_ms, the survivors agree through the store, reset their
// workspaces and go on under the mask with 0 wrong entries against the
// oracle.  Exits 77 (skipped) where no process can use a GPU.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "case_skip.hpp"
#include "device_inputs.hpp"
#include "gpu_test_env.hpp"
#include "masked_round.hpp"
#include "rank_failure_scenario.hpp"

using namespace moe_ep_test;

namespace {

// The handle of rank r on GPU r % count, NVLINK_TWO_SIDED under MASK.
RankSetup nvlink_setup() {
  RankSetup setup;
  setup.config = [](const char* address, int rank) {
    moe_ep_config_t c = mask_config(address, "ep", kTimeoutMs);
    int count = 0;
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.device = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? rank % count : 0;
    return c;
  };
  setup.memory = [](int rank) {
    int count = 0;
    cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
    const int device = rank % count;
    cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    auto inputs = std::make_shared<DeviceInputs>(scenario_spec());
    RoundMemory m;
    m.device = moe_ep_device_t{MOE_EP_DEVICE_CUDA, device};
    m.place = [inputs](const RankInputs& in, const std::vector<uint8_t>& expert_output,
                       moe_ep_verify::DispatchMemory* memory) {
      inputs->upload(in, expert_output);
      *memory = inputs->memory();
      return static_cast<const void*>(inputs->expert_output.get());
    };
    m.read = read_device_memory;
    return m;
  };
  return setup;
}

// Whether a process of this machine can use a GPU (asked in a child: the
// test process itself must not touch CUDA before it forks the ranks).
bool gpu_usable(ForkLauncher& launcher) {
  const pid_t probe = launcher.spawn([] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? 0 : 77;
  });
  return launcher.wait_exit(probe, 60000) == 0;
}

std::unique_ptr<ForkLauncher> start_gpu_launcher() {
  std::unique_ptr<ForkLauncher> launcher = start_launcher();
  if (launcher && !gpu_usable(*launcher)) {
    skip_case("no CUDA device usable here");
    return nullptr;
  }
  return launcher;
}

// The survivors' reports when nobody rejoins: every survivor named `victim`
// first, ends with `active` ranks at mask epoch 1, and got 0 wrong entries.
Outcome survivors_outcome(Board& board, const std::vector<int>& survivors, int victim) {
  Outcome out;
  for (int r : survivors) {
    INFO("rank " << r << " error: " << board.get("error/" + std::to_string(r)));
    CHECK(board.get("error/" + std::to_string(r)).empty());
    INFO("rank " << r << ": " << board.get("wrong_details/" + std::to_string(r)));
    CHECK(board.get("failed_rank/" + std::to_string(r) + "/0") == std::to_string(victim));
    CHECK(board.get("final/" + std::to_string(r)) == std::to_string(survivors.size()) + " active, epoch 1");
    REQUIRE(!board.get("wrong/" + std::to_string(r)).empty());
    out.wrong += std::stoll(board.get("wrong/" + std::to_string(r)));
    out.rounds += std::stoll(board.get("rounds/" + std::to_string(r)));
    out.worst["detect_ms"] = std::max(out.worst["detect_ms"], board.number("detect_ms/" + std::to_string(r) + "/0"));
    out.worst["first_masked_ms"] =
        std::max(out.worst["first_masked_ms"], board.number("first_masked_ms/" + std::to_string(r)));
  }
  print_outcome(out);
  return out;
}

}  // namespace

TEST_CASE("nvlink rank failure: kill -9 of one of 4 ranks mid-stream, the survivors go on masked",
          "[rank_failure][gpu]") {
  std::printf("NVLINK_TWO_SIDED: kill -9 of rank 2 of 4 at round 300 of 1000:\n");
  const std::unique_ptr<ForkLauncher> started = start_gpu_launcher();
  if (!started) return;
  ForkLauncher& launcher = *started;
  Script s;
  s.rounds = 1000;
  const std::vector<pid_t> pids = spawn_group(launcher, s, nvlink_setup());
  Board board(launcher.store_address());
  kill_at_round(launcher, board, pids[2], 2, 300);
  for (int r : others(2)) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  const Outcome out = survivors_outcome(board, others(2), 2);
  check_bounds(out, false);
}

TEST_CASE("nvlink rank failure: a rank that stalls is dropped and learns it", "[rank_failure][gpu]") {
  std::printf("NVLINK_TWO_SIDED: rank 3 of 4 stalls 2.5 x timeout_ms at round 150 of 600:\n");
  const std::unique_ptr<ForkLauncher> started = start_gpu_launcher();
  if (!started) return;
  ForkLauncher& launcher = *started;
  Script s;
  s.rounds = 600;
  s.stall_rank = 3;
  s.stall_round = 150;
  const std::vector<pid_t> pids = spawn_group(launcher, s, nvlink_setup());
  Board board(launcher.store_address());
  for (int r = 0; r < kWorld; ++r) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  INFO("the stalled rank's last error: " << board.get("dropped/3"));
  CHECK(board.get("dropped/3").find("dropped it from the group") != std::string::npos);
  CHECK(board.get("wrong_before_drop/3") == "0");
  const Outcome out = survivors_outcome(board, others(3), 3);
  check_bounds(out, false);
}
