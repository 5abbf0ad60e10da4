// Surviving a dead rank on NVLINK_TWO_SIDED (failure_policy MASK;
// docs/nvlink_backend.md, "Surviving a dead rank"): the scenarios of the HOST
// test (test/support/rank_failure_scenario.hpp) with every rank's tensors on
// a GPU.  4 ranks as forked processes share the machine's GPUs (rank r on
// GPU r % count; on one GPU all four share it, which the backend allows);
// the store runs in a process of its own.  One rank is killed with SIGKILL
// mid-stream, or stalls without dying; the survivors' kernels give up on it
// after timeout_ms, the survivors agree through the store, reset their
// workspaces and go on under the mask with 0 wrong entries against the
// oracle.  The kill is also run with every round a replay of CUDA graphs
// captured before the failure, and with a replacement process that rejoins
// (its memory exchanged again) after which all four ranks are exact again.  Exits 77 (skipped) where no process can use
// a GPU.
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
#include "oracle.hpp"
#include "rank_failure_scenario.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"

using namespace moe_ep_test;
using namespace moe_ep_verify;

namespace {

int rank_device(int rank) {
  int count = 0;
  cuda_ok(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  return rank % count;
}

// Every round a replay of two graphs captured in the first round, one of the
// dispatch and one of the combine (into the handle's output), on fixed device
// inputs refilled each round; every rank sends max_tokens_per_rank tokens, so
// the shapes never change.  The dispatch results are read between the two
// replays: they are valid only until the matching combine is issued (a peer's
// next dispatch may overwrite them after that).  After a failure, which the
// health poll reports once a replay has ended, no eager call is left to
// recover in: the round calls moe_ep_set_active_ranks with the current mask,
// where the handle recovers (it returns TIMEOUT), and the next round replays
// the same graphs.
class GraphRounds {
 public:
  explicit GraphRounds(int rank) : rank_(rank), device_(rank_device(rank)) {
    cuda_ok(cudaSetDevice(device_), "cudaSetDevice");
    inputs_ = std::make_unique<DeviceInputs>(scenario_spec());
    cuda_ok(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~GraphRounds() {
    if (dispatch_exec_) cudaGraphExecDestroy(dispatch_exec_);
    if (combine_exec_) cudaGraphExecDestroy(combine_exec_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  GraphRounds(const GraphRounds&) = delete;
  GraphRounds& operator=(const GraphRounds&) = delete;

  MaskedRound run(moe_ep_handle_t h, WorkloadSpec w) {
    w.tokens.assign(size_t(w.world), w.max_tokens_per_rank);
    MaskedRound r;
    r.mask.assign(size_t(w.world), 0);
    if (!note_call(r, moe_ep_get_active_ranks(h, r.mask.data(), w.world), "moe_ep_get_active_ranks")) return r;
    const std::vector<RankRouting> masked = mask_routing(w, make_all_routing(w), r.mask);
    const RankInputs in = make_rank_inputs(w, rank_);
    inputs_->upload(in, make_expert_output(w, rank_));
    if (!dispatch_exec_ && !capture(h, w, r)) return r;
    Verdict v;
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device_};
    replay(dispatch_exec_);
    v.merge(check_dispatch(w, masked, rank_, read_dispatch(w, dispatched_, dev, read_device_memory, v)));
    if (failed(h, w, r)) return r;
    replay(combine_exec_);
    v.merge(
        check_combine(w, masked, rank_, read_combine(w, combined_, in.routing.num_tokens, dev, read_device_memory, v)));
    if (failed(h, w, r)) return r;
    r.wrong = v.wrong;
    r.details = v.details;
    return r;
  }

 private:

  void replay(cudaGraphExec_t exec) {
    cuda_ok(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
    cuda_ok(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  // After a replay: a failure the poll reports makes the round's results
  // invalid; the round recovers (TIMEOUT expected) and says so in r.
  bool failed(moe_ep_handle_t h, const WorkloadSpec& w, MaskedRound& r) {
    if (poll_health(h).status == MOE_EP_SUCCESS) return false;
    note_call(r, moe_ep_set_active_ranks(h, r.mask.data(), w.world), "moe_ep_set_active_ranks (the recovery)");
    if (r.status == MOE_EP_SUCCESS) note_call(r, MOE_EP_ERROR_INTERNAL, "recovery after a failed replay");
    return true;
  }

  // One call into one graph.
  template <typename Call>
  bool capture_one(cudaGraphExec_t* exec, const Call& call) {
    cuda_ok(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    const bool issued = call();
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    if (issued) cuda_ok(cudaGraphInstantiate(exec, graph, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(graph);
    return issued;
  }

  bool capture(moe_ep_handle_t h, const WorkloadSpec& w, MaskedRound& r) {
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device_};
    DispatchArgs args(w, w.num_tokens(rank_), inputs_->memory(), dev);
    const TensorView eo = expert_output_view(w, inputs_->expert_output.get(), dev, false);
    moe_ep_dispatch_result_init(&dispatched_, sizeof dispatched_);
    moe_ep_combine_result_init(&combined_, sizeof combined_);
    return capture_one(&dispatch_exec_,
                       [&] {
                         return note_call(r, moe_ep_dispatch(h, args.get(), &dispatched_, stream_),
                                          "dispatch (capture)");
                       }) &&
           capture_one(&combine_exec_, [&] {
             return note_call(r, moe_ep_combine(h, eo.get(), nullptr, &combined_, stream_), "combine (capture)");
           });
  }

  int rank_;
  int device_;
  std::unique_ptr<DeviceInputs> inputs_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t dispatch_exec_ = nullptr;
  cudaGraphExec_t combine_exec_ = nullptr;
  moe_ep_dispatch_result_t dispatched_{};
  moe_ep_combine_result_t combined_{};
};

// The handle of rank r on GPU r % count, NVLINK_TWO_SIDED under MASK.
RankSetup nvlink_setup() {
  RankSetup setup;
  setup.align_rounds_after_failure = true;
  setup.config = [](const char* address, int rank) {
    moe_ep_config_t c = mask_config(address, "ep", kTimeoutMs);
    int count = 0;
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.device = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 ? rank % count : 0;
    return c;
  };
  setup.memory = [](int rank) {
    const int device = rank_device(rank);
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

RankSetup graph_setup() {
  RankSetup setup = nvlink_setup();
  setup.memory = nullptr;
  setup.rounds = [](int rank) {
    auto rounds = std::make_shared<GraphRounds>(rank);
    return RoundRunner([rounds](moe_ep_handle_t h, const WorkloadSpec& w) { return rounds->run(h, w); });
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

// The survivors' reports when nobody rejoins: every survivor named the
// victims in order, ends with the survivors active at mask epoch
// victims.size(), and got 0 wrong entries.
Outcome survivors_outcome(Board& board, const std::vector<int>& survivors, const std::vector<int>& victims) {
  Outcome out;
  for (int r : survivors) {
    const std::string me = std::to_string(r);
    INFO("rank " << r << " error: " << board.get("error/" + me));
    CHECK(board.get("error/" + me).empty());
    INFO("rank " << r << ": " << board.get("wrong_details/" + me));
    for (size_t n = 0; n < victims.size(); ++n) {
      const std::string at = me + "/" + std::to_string(n);
      CHECK(board.get("failed_rank/" + at) == std::to_string(victims[n]));
      out.worst["detect_ms"] = std::max(out.worst["detect_ms"], board.number("detect_ms/" + at));
    }
    CHECK(board.get("final/" + me) ==
          std::to_string(survivors.size()) + " active, epoch " + std::to_string(victims.size()));
    REQUIRE(!board.get("wrong/" + me).empty());
    out.wrong += std::stoll(board.get("wrong/" + me));
    out.rounds += std::stoll(board.get("rounds/" + me));
    out.worst["first_masked_ms"] = std::max(out.worst["first_masked_ms"], board.number("first_masked_ms/" + me));
  }
  print_outcome(out);
  return out;
}

// 4 ranks under `setup`, rank `victim` killed with SIGKILL at `round` of
// `rounds`: the survivors name it, go on at mask epoch 1, 0 wrong entries.
void kill_scenario(const RankSetup& setup, int victim, int round, int rounds) {
  const std::unique_ptr<ForkLauncher> started = start_gpu_launcher();
  if (!started) return;
  ForkLauncher& launcher = *started;
  Script s;
  s.rounds = rounds;
  const std::vector<pid_t> pids = spawn_group(launcher, s, setup);
  Board board(launcher.store_address());
  kill_at_round(launcher, board, pids[size_t(victim)], victim, round);
  for (int r : others(victim)) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  check_bounds(survivors_outcome(board, others(victim), {victim}), false);
}

}  // namespace

TEST_CASE("nvlink rank failure: kill -9 of one of 4 ranks mid-stream, the survivors go on masked",
          "[rank_failure][gpu]") {
  std::printf("NVLINK_TWO_SIDED: kill -9 of rank 2 of 4 at round 300 of 1000:\n");
  kill_scenario(nvlink_setup(), 2, 300, 1000);
}

TEST_CASE("nvlink rank failure: kill -9, the survivors go on masked, a replacement process rejoins",
          "[rank_failure][gpu]") {
  std::printf("NVLINK_TWO_SIDED: kill -9 of rank 2 of 4 at round 300 of 1000, replacement admitted at round 600:\n");
  const std::unique_ptr<ForkLauncher> launcher = start_gpu_launcher();
  if (launcher) kill_and_rejoin_scenario(*launcher, nvlink_setup());
}

TEST_CASE("nvlink rank failure: a rank dies during the mask update that admits a replacement", "[rank_failure][gpu]") {
  std::printf(
      "NVLINK_TWO_SIDED: rank 0 of 4 killed at round 100; at its admission (round 250) rank 3 dies; "
      "400 rounds:\n");
  const std::unique_ptr<ForkLauncher> launcher = start_gpu_launcher();
  if (launcher) failure_during_admission_scenario(*launcher, nvlink_setup());
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
  const Outcome out = survivors_outcome(board, others(3), {3});
  check_bounds(out, false);
}

TEST_CASE("nvlink rank failure: a CUDA graph captured before a kill -9 replays under the mask after it",
          "[rank_failure][gpu]") {
  std::printf("NVLINK_TWO_SIDED, graph replays: kill -9 of rank 1 of 4 at round 200 of 600:\n");
  kill_scenario(graph_setup(), 1, 200, 600);
}

TEST_CASE("nvlink rank failure: two failures, the second right after the first was masked", "[rank_failure][gpu]") {
  std::printf(
      "NVLINK_TWO_SIDED: rank 1 of 4 killed at round 100; rank 3 dies as its call returns that failure; "
      "400 rounds:\n");
  const std::unique_ptr<ForkLauncher> started = start_gpu_launcher();
  if (!started) return;
  ForkLauncher& launcher = *started;
  Script s;
  s.rounds = 400;
  s.suicide_on_first_failure = 3;
  const std::vector<pid_t> pids = spawn_group(launcher, s, nvlink_setup());
  Board board(launcher.store_address());
  kill_at_round(launcher, board, pids[1], 1, 100);
  CHECK(launcher.wait_exit(pids[3], 120000) == 128 + SIGKILL);
  for (int r : others(1, 3)) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  const Outcome out = survivors_outcome(board, others(1, 3), {1, 3});
  check_bounds(out, false);
}
