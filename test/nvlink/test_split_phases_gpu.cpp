// The split phases on a GPU backend (docs/overlap.md): dispatch_send,
// dispatch_recv, combine_send and combine_recv on one slot, and two
// micro-batches in flight through slots 0 and 1 in interleaved orders, eager
// and captured in CUDA graphs (one graph per round, or the send halves and the
// receive halves in graphs of their own), compared byte for byte with the HOST
// backend on fresh random inputs (gpu_case_runner.cpp); misuse of a slot's
// state machine; and a timeout in each half that waits.  Runs under mpiexec
// with any number of ranks, on NVLINK_TWO_SIDED or (MOE_EP_TEST_GPU_BACKEND=nccl)
// NCCL.  A backend that answers UNSUPPORTED (no halves yet, or no second slot)
// skips the cases that need them.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "case_skip.hpp"
#include "dtypes.hpp"
#include "gpu_case_runner.hpp"
#include "gpu_test_env.hpp"
#include "mpi_test_bootstrap.hpp"
#include "scoped_environment.hpp"
#include "tensor_view.hpp"

using namespace moe_ep_test;
using namespace moe_ep_verify;

namespace {

// A workload over this job's ranks; num_experts rounded up to a multiple of
// the world size (3 ranks: 258 for DeepSeek's 256).
WorkloadSpec workload(int num_experts, int top_k, int hidden, int max_tokens, uint64_t seed) {
  WorkloadSpec s;
  s.seed = seed;
  s.world = mpi_world_size();
  s.hidden_size = hidden;
  s.top_k = top_k;
  s.num_experts = (num_experts + s.world - 1) / s.world * s.world;
  s.max_tokens_per_rank = max_tokens;
  return s;
}

const char* phases_name(GpuPhases p) {
  switch (p) {
    case GpuPhases::fused: return "fused";
    case GpuPhases::split: return "split";
    case GpuPhases::micro_batches2: return "micro_batches2";
  }
  return "?";
}

// Whether the backend under test runs the halves that `o` asks for (probed
// once per setting, on every rank); if not, the running case is skipped with
// the backend's reason.  Every rank runs the same cases in the same order, so
// every rank probes, and reads the same cache, at the same points.
bool halves_supported(const GpuCaseOptions& o) {
  static std::map<std::pair<int32_t, bool>, std::string> reasons;  // (micro_batches, zero_copy) -> why not
  const std::pair<int32_t, bool> key{o.micro_batches(), o.zero_copy_combine};
  auto it = reasons.find(key);
  if (it == reasons.end()) {
    std::string why, failure;
    try {
      why = split_phases_unsupported(workload(64, 8, 256, 16, 1), world_bootstrap(), o);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    INFO(failure);
    REQUIRE(mpi_all(failure.empty()));
    // A rank whose backend runs them while another's does not is a failure, not a skip.
    const bool none = mpi_all(!why.empty());
    INFO(why);
    REQUIRE(mpi_all(why.empty()) != none);
    it = reasons.emplace(key, why).first;
  }
  if (it->second.empty()) return true;
  skip_case(std::string(phases_name(o.phases)) + (o.zero_copy_combine ? " with zero_copy_combine" : "") + ": " +
            it->second);
  return false;
}

// Runs the case on every rank; passes only if it passed on every rank.
// `extra` adds this rank's findings of the case's hooks.
void require_case(const WorkloadSpec& spec, const GpuCaseOptions& o, const std::function<std::string()>& extra = {}) {
  std::string failure;
  try {
    failure = run_gpu_case(spec, world_bootstrap(), o);
  } catch (const std::exception& e) {
    failure = std::string("exception: ") + e.what();
  }
  if (extra) failure += extra();
  INFO(phases_name(o.phases) << (o.graph ? (o.graph_per_kind ? ", a graph per run of sends/receives" : ", one graph")
                                         : ", eager")
                             << (o.caller_output ? ", caller output" : ", library output")
                             << (o.zero_copy_combine ? ", zero-copy" : "") << ": " << spec.describe());
  INFO(failure);
  REQUIRE(mpi_all(failure.empty()));
}

// The case through each of `phases` that the backend runs (the others skip).
void check_phases(const WorkloadSpec& spec, GpuCaseOptions o,
                  std::initializer_list<GpuPhases> phases = {GpuPhases::split, GpuPhases::micro_batches2}) {
  for (const GpuPhases p : phases) {
    o.phases = p;
    if (halves_supported(o)) require_case(spec, o);
  }
}

// Eager, one graph, and a graph per run of sends and of receives.
void check_eager_and_graphs(const WorkloadSpec& spec, const GpuCaseOptions& base) {
  for (const int variant : {0, 1, 2}) {
    GpuCaseOptions o = base;
    o.graph = variant > 0;
    o.graph_per_kind = variant == 2;
    check_phases(spec, o);
  }
}

}  // namespace

TEST_CASE("split halves on the GPU: DeepSeek-like rows (bf16, hidden 7168, top-8 of 256), unequal counts",
          "[gpu][split]") {
  WorkloadSpec s = workload(256, 8, 7168, 128, 1001);
  GpuCaseOptions library;
  check_phases(s, library);
  GpuCaseOptions caller;
  caller.caller_output = true;
  s.seed = 1002;
  check_phases(s, caller);
  WorkloadSpec first = workload(64, 8, 7168, 96, 1003);  // the fused suite's first shape
  check_phases(first, library);
}

TEST_CASE("split halves on the GPU in CUDA graphs: one graph per round, or sends and receives apart",
          "[gpu][split][graph]") {
  GpuCaseOptions o;
  o.rounds = 4;
  for (const bool caller : {false, true}) {
    WorkloadSpec s = workload(256, 8, 7168, 64, 1011 + caller);
    if (caller) s.runtime_max_tokens_per_rank = 50;  // the graph's calls pass it
    o.caller_output = caller;
    check_eager_and_graphs(s, o);
  }
  o.caller_output = false;
  check_eager_and_graphs(workload(64, 4, 1024, 8, 1013), o);  // a decode step
}

TEST_CASE("two micro-batches in flight on the GPU: interleavings, slot assignments, unequal counts",
          "[gpu][split][micro_batches]") {
  GpuCaseOptions o;
  o.phases = GpuPhases::micro_batches2;
  if (!halves_supported(o)) return;
  WorkloadSpec s = workload(256, 8, 7168, 96, 1021);
  const std::vector<std::vector<int>> orders = {
      {},                        // A.ds B.ds A.dr A.cs B.dr A.cr B.cs B.cr
      {0, 0, 1, 0, 1, 1, 0, 1},  // A.ds A.dr B.ds A.cs B.dr B.cs A.cr B.cr
      {0, 0, 0, 1, 1, 1, 1, 0},  // B's whole pair inside A's combine
      {1, 0, 1, 0, 1, 0, 1, 0},  // B first, every half alternating
      {0, 0, 0, 0, 1, 1, 1, 1},  // one after the other
  };
  for (size_t i = 0; i < orders.size(); ++i) {
    INFO("interleaving " << i);
    o.interleaving = orders[i];
    o.slot_of_a = static_cast<int32_t>(i % 2);
    o.caller_output = i % 3 == 1;
    s.seed = 1021 + i;
    require_case(s, o);
  }
  // Graphs of every half of both micro-batches, and of each run of sends and
  // receives; the alternating order puts both dispatch_sends in one graph, both
  // dispatch_recvs in the next, and so on.
  o.slot_of_a = 1;
  o.graph = true;
  for (const bool per_kind : {false, true}) {
    for (const bool alternating : {false, true}) {
      o.graph_per_kind = per_kind;
      o.interleaving = alternating ? std::vector<int>{0, 1, 0, 1, 0, 1, 0, 1} : std::vector<int>{};
      s.seed = 1031 + 2 * per_kind + alternating;
      require_case(s, o);
    }
  }
  // B with other token counts than A: zero on another rank, and a full batch.
  WorkloadSpec zero = workload(64, 8, 2048, 48, 1033);
  for (int r = 0; r < zero.world; ++r) zero.tokens.push_back(r == 0 ? 0 : 48 - 5 * r);
  GpuCaseOptions uneven;
  uneven.phases = GpuPhases::micro_batches2;
  for (int r = 0; r < zero.world; ++r) uneven.second_tokens.push_back(r == zero.world - 1 ? 0 : 48);
  require_case(zero, uneven);
  uneven.graph = true;
  uneven.graph_per_kind = true;
  require_case(zero, uneven);
}

TEST_CASE("split halves on the GPU: fp16 and fp32 rows, rows not a multiple of 16 bytes, fp8 and fp4 with scales",
          "[gpu][split]") {
  WorkloadSpec fp16 = workload(64, 8, 2880, 64, 1041);
  fp16.hidden_dtype = fp16_dtype();
  fp16.combine_dtype = fp16_dtype();
  fp16.weights = false;
  check_phases(fp16, GpuCaseOptions{});

  WorkloadSpec fp32 = workload(64, 8, 100, 64, 1042);
  fp32.hidden_dtype = fp32_dtype();
  fp32.combine_dtype = fp32_dtype();
  check_phases(fp32, GpuCaseOptions{});

  WorkloadSpec odd = workload(64, 4, 100, 33, 1043);  // bf16 rows of 200 bytes
  check_phases(odd, GpuCaseOptions{});

  WorkloadSpec fp8 = workload(64, 8, 4096, 80, 1044);
  fp8.hidden_dtype = fp8_e4m3_dtype();
  fp8.scale_row_elems = 4096 / 128;
  fp8.scale_dtype = fp32_dtype();
  fp8.eplb_stats = true;
  check_phases(fp8, GpuCaseOptions{});

  WorkloadSpec fp4 = workload(64, 8, 7168, 80, 1045);  // packed: 3584 bytes per row
  fp4.hidden_dtype = fp4_dtype();
  fp4.scale_row_elems = 7168 / 16;
  fp4.scale_dtype = fp8_e4m3_dtype();
  fp4.weights = false;
  check_phases(fp4, GpuCaseOptions{});
}

TEST_CASE("split halves on the GPU: zero tokens on a rank and on every rank, runtime_max below the maximum, masks",
          "[gpu][split]") {
  WorkloadSpec zero = workload(64, 8, 4096, 64, 1051);
  zero.runtime_max_tokens_per_rank = 40;
  for (int r = 0; r < zero.world; ++r) zero.tokens.push_back(r == 0 ? 0 : 40 - 3 * r);
  check_phases(zero, GpuCaseOptions{});
  GpuCaseOptions graph;
  graph.graph = true;
  graph.graph_per_kind = true;
  check_phases(zero, graph);

  WorkloadSpec all_zero = workload(64, 8, 256, 16, 1052);
  all_zero.tokens.assign(all_zero.world, 0);
  check_phases(all_zero, GpuCaseOptions{});

  WorkloadSpec masked = workload(64, 8, 2880, 64, 1053);
  masked.routing.mask_fraction = 0.35;
  masked.eplb_stats = true;
  check_phases(masked, GpuCaseOptions{});
}

namespace {

// The case, eager, through each of the halves the backend runs; on
// NVLINK_TWO_SIDED it also checks which kernels round 0 took (its last
// dispatch and combine paths, read before round 1's first half): the
// small-batch ones or the general ones.
void check_kernels(const WorkloadSpec& spec, GpuCaseOptions o, bool small_batch) {
  for (const GpuPhases p : {GpuPhases::split, GpuPhases::micro_batches2}) {
    o.phases = p;
    if (!halves_supported(o)) continue;
    int32_t dispatch = MOE_EP_PATH_NONE, combine = MOE_EP_PATH_NONE;
    o.before_half = [&](const GpuHalfCall& c) {
      if (c.round != 1 || c.micro_batch != 0 || c.half != kDispatchSend) return;
      moe_ep_get_last_path(c.handle, MOE_EP_PHASE_DISPATCH, &dispatch);
      moe_ep_get_last_path(c.handle, MOE_EP_PHASE_COMBINE, &combine);
    };
    require_case(spec, o, [&]() -> std::string {
      if (o.backend != MOE_EP_BACKEND_NVLINK_TWO_SIDED) return "";
      const bool small_dispatch = dispatch == MOE_EP_PATH_DISPATCH_SMALL || dispatch == MOE_EP_PATH_DISPATCH_SMALL_BULK;
      const bool small_combine = combine == MOE_EP_PATH_COMBINE_SMALL_PUSH;
      if (dispatch != MOE_EP_PATH_NONE && small_dispatch == small_batch && small_combine == small_batch) return "";
      return std::string("expected the ") + (small_batch ? "small-batch" : "general") + " kernels; round 0 took " +
             moe_ep_path_name(dispatch) + " and " + moe_ep_path_name(combine) + "\n";
    });
  }
}

}  // namespace

// With the knobs that choose the small-batch kernels at their defaults, a
// call of at most 8 tokens per rank takes them and one of 1024 or more the
// general kernels.
TEST_CASE("split halves on the GPU: small calls (1 to 8 tokens) and large ones (1024 and more tokens per rank)",
          "[gpu][split][sizes]") {
  const ScopedEnvironment small_batch("MOE_EP_SMALL_BATCH", nullptr);
  const ScopedEnvironment dispatch_bound("MOE_EP_SMALL_DISPATCH_TOKENS", nullptr);
  const ScopedEnvironment combine_bound("MOE_EP_SMALL_COMBINE_TOKENS", nullptr);
  GpuCaseOptions o;
  o.rounds = 4;
  for (const int tokens : {1, 8}) {
    WorkloadSpec s = workload(256, 8, 7168, tokens, 1060 + tokens);
    s.tokens.assign(s.world, tokens);
    check_kernels(s, o, true);
    for (const bool per_kind : {false, true}) {
      GpuCaseOptions graph = o;
      graph.graph = true;
      graph.graph_per_kind = per_kind;
      check_phases(s, graph);
    }
  }
  WorkloadSpec large = workload(256, 8, 7168, 1024, 1071);
  for (int r = 0; r < large.world; ++r) large.tokens.push_back(1024 - 13 * r);
  large.eplb_stats = true;
  o.rounds = 2;
  check_kernels(large, o, false);
  o.graph = true;
  large.seed = 1072;
  check_phases(large, o);
  WorkloadSpec wide = workload(64, 8, 2048, 2048, 1073);  // token counts drawn per round, up to 2048
  wide.routing.mask_fraction = 0.1;
  GpuCaseOptions caller;
  caller.rounds = 2;
  caller.caller_output = true;
  check_phases(wide, caller);
}

TEST_CASE("split halves on the GPU: zero-copy combine through each slot's combine_input view",
          "[gpu][split][zero_copy]") {
  WorkloadSpec s = workload(64, 8, 7168, 96, 1081);
  GpuCaseOptions o;
  o.zero_copy_combine = true;
  o.rounds = 4;
  check_phases(s, o);
  o.caller_output = true;
  s.runtime_max_tokens_per_rank = 40;  // a view of fewer rows than the region holds
  s.seed = 1082;
  check_phases(s, o);
  // Odd ranks pass their own buffer in even rounds, even ranks in odd rounds.
  GpuCaseOptions mixed = o;
  mixed.caller_output = false;
  mixed.zero_copy_passes_view = [](int rank, int round) { return (rank + round) % 2 == 0; };
  WorkloadSpec m = workload(64, 8, 2048, 512, 1083);
  check_phases(m, mixed);
  WorkloadSpec tiny = workload(64, 8, 7168, 4, 1084);
  tiny.tokens.assign(tiny.world, 4);
  check_phases(tiny, o);
}

namespace {

// Before each half of an eager split round, tries every call the slot's
// state refuses (and slots out of range), each on a side stream under capture:
// each must answer INVALID_STATE (INVALID_ARGUMENT for the slot), with the
// handle's message, and capture no work.  The round then runs on and must
// match the HOST backend: the handle stayed usable and in step.
class MisuseProbe {
 public:
  MisuseProbe() { cuda_ok(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~MisuseProbe() { cudaStreamDestroy(side_); }
  MisuseProbe(const MisuseProbe&) = delete;
  MisuseProbe& operator=(const MisuseProbe&) = delete;

  void operator()(const GpuHalfCall& c) {
    moe_ep_dispatch_result_t dr;
    moe_ep_dispatch_result_init(&dr, sizeof dr);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    using Call = std::function<moe_ep_status_t(int32_t slot, void* stream)>;
    const std::pair<GpuHalf, Call> halves[] = {
        {kDispatchSend, [&](int32_t s, void* st) { return moe_ep_dispatch_send(c.handle, s, c.args, st); }},
        {kDispatchRecv, [&](int32_t s, void* st) { return moe_ep_dispatch_recv(c.handle, s, &dr, st); }},
        {kCombineSend, [&](int32_t s, void* st) { return moe_ep_combine_send(c.handle, s, c.expert_output, st); }},
        {kCombineRecv, [&](int32_t s, void* st) { return moe_ep_combine_recv(c.handle, s, nullptr, &cr, st); }},
    };
    const char* names[] = {"dispatch_send", "dispatch_recv", "combine_send", "combine_recv"};
    for (const auto& entry : halves) {
      const Call& call = entry.second;
      // The one half the slot's state expects is the runner's next call.
      if (entry.first != c.half) {
        expect(c, names[entry.first], MOE_EP_ERROR_INVALID_STATE, [&](void* st) { return call(c.slot, st); });
      }
      for (const int32_t bad : {c.slots, int32_t{-1}}) {
        expect(c, names[entry.first], MOE_EP_ERROR_INVALID_ARGUMENT, [&](void* st) { return call(bad, st); });
      }
    }
    if (c.slot == 0 && c.half != kDispatchSend) {  // the fused calls are slot 0's halves
      expect(c, "moe_ep_dispatch", MOE_EP_ERROR_INVALID_STATE,
             [&](void* st) { return moe_ep_dispatch(c.handle, c.args, &dr, st); });
    }
    if (c.slot == 0 && c.half != kCombineSend) {
      expect(c, "moe_ep_combine", MOE_EP_ERROR_INVALID_STATE,
             [&](void* st) { return moe_ep_combine(c.handle, c.expert_output, nullptr, &cr, st); });
    }
  }

  std::string findings() const {
    if (tried_ == 0) return "no misuse was tried\n";
    return problems_;
  }

 private:
  void expect(const GpuHalfCall& c, const char* call_name, moe_ep_status_t expected,
              const std::function<moe_ep_status_t(void*)>& call) {
    ++tried_;
    cudaGraph_t graph = nullptr;
    cuda_ok(cudaStreamBeginCapture(side_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    const moe_ep_status_t got = call(side_);
    const std::string message = got == MOE_EP_SUCCESS ? "" : moe_ep_last_error();
    const cudaError_t ended = cudaStreamEndCapture(side_, &graph);
    size_t nodes = 0;
    if (ended == cudaSuccess && graph != nullptr) {
      cudaGraphGetNodes(graph, nullptr, &nodes);
      cudaGraphDestroy(graph);
    }
    std::string wrong;
    if (got != expected) wrong += std::string(" answered ") + moe_ep_status_string(got) + " '" + message + "'";
    if (ended != cudaSuccess) wrong += std::string(" broke the side stream's capture: ") + cudaGetErrorName(ended);
    if (nodes != 0) wrong += " launched work (" + std::to_string(nodes) + " captured nodes)";
    const char* must_say =
        expected == MOE_EP_ERROR_INVALID_STATE ? "nothing was done, the handle stays usable" : "micro_batches";
    if (got == expected && message.find(must_say) == std::string::npos) {
      wrong += " said '" + message + "', without '" + must_say + "'";
    }
    if (!wrong.empty() && problems_.size() < 4000) {
      problems_ += "round " + std::to_string(c.round) + ", micro-batch " + std::to_string(c.micro_batch) + " (slot " +
                   std::to_string(c.slot) + ") before its half " + std::to_string(int(c.half)) + ": " + call_name +
                   " expected " + moe_ep_status_string(expected) + ";" + wrong + "\n";
    }
  }

  cudaStream_t side_ = nullptr;
  int tried_ = 0;
  std::string problems_;
};

}  // namespace

TEST_CASE("split halves on the GPU: misuse is INVALID_STATE, launches nothing, and the handle stays usable",
          "[gpu][split][misuse]") {
  WorkloadSpec s = workload(64, 8, 1024, 32, 1091);
  for (const GpuPhases p : {GpuPhases::split, GpuPhases::micro_batches2}) {
    GpuCaseOptions o;
    o.phases = p;
    if (!halves_supported(o)) continue;
    MisuseProbe probe;
    o.before_half = [&](const GpuHalfCall& c) { probe(c); };
    o.rounds = 2;
    require_case(s, o, [&] { return probe.findings(); });
    // And the next case on fresh handles is unaffected.
    require_case(workload(64, 8, 1024, 32, 1092), GpuCaseOptions{});
  }
}

namespace {

// Seconds until `stream` had finished its work, polled; a negative value if
// it had not within `limit_s`.  `error` gets the stream's status.
double seconds_until_idle(cudaStream_t stream, double limit_s, cudaError_t* error) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (q != cudaErrorNotReady) {
      *error = q;
      return t;
    }
    if (t > limit_s) {
      *error = q;
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Whether a TIMEOUT message names `rank` among the ranks it waited for.
bool names_rank(const std::string& message, int rank) {
  const std::regex pattern("ranks? ([0-9]+(, | and ))*" + std::to_string(rank) + "\\b");
  return std::regex_search(message, pattern);
}

// The last rank stops before `skipped` (kDispatchSend or kCombineSend) of the
// last micro-batch of a round and issues nothing of that micro-batch after it,
// while every other rank issues the whole round.  The others' streams must
// finish within 10 x timeout_ms, their handles report TIMEOUT (moe_ep_get_async_error,
// then every call), and destroy returns promptly on every rank.
void check_split_timeout(GpuCaseOptions o, GpuHalf skipped) {
  const int world = mpi_world_size();
  const int missing = world - 1;
  const int rank = mpi_rank();
  const bool nccl = o.backend == MOE_EP_BACKEND_NCCL;
  o.timeout_ms = nccl ? 1000 : 300;  // NCCL aborts its communicator from the host
  const double limit_s = 10.0 * o.timeout_ms / 1000;
  const WorkloadSpec s = workload(64, 8, 1024, 32, 1101 + skipped);
  const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, gpu_device()};
  const std::vector<GpuStep> steps = split_round_steps(o);
  const int last = o.micro_batches() - 1;
  bool ok = true;
  std::string why = std::string(phases_name(o.phases)) + (o.zero_copy_combine ? " zero-copy" : "") +
                    ", last rank skips half " + std::to_string(int(skipped)) + ":";
  auto note = [&](bool fine, const std::string& what) {
    if (!fine) why += " " + what + ";";
    ok = ok && fine;
  };
  {
    CaseHandle h(world_bootstrap(), s, o.backend, o, gpu_device());
    DeviceInputs in(s);
    const RankInputs d = make_rank_inputs(s, rank);
    in.upload(d, make_expert_output(s, rank));
    DispatchArgs args(s, d.routing.num_tokens, in.memory(), dev);
    const TensorView eo = expert_output_view(s, in.expert_output.get(), dev);
    cudaStream_t stream = nullptr;
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    auto issue = [&](const GpuStep& step) {
      const int32_t slot = o.micro_batches() == 2 ? step.micro_batch : 0;
      moe_ep_dispatch_result_t dr;
      moe_ep_dispatch_result_init(&dr, sizeof dr);
      moe_ep_combine_result_t cr;
      moe_ep_combine_result_init(&cr, sizeof cr);
      switch (step.half) {
        case kDispatchSend: return moe_ep_dispatch_send(h.get(), slot, args.get(), stream);
        case kDispatchRecv: return moe_ep_dispatch_recv(h.get(), slot, &dr, stream);
        case kCombineSend: return moe_ep_combine_send(h.get(), slot, eo.get(), stream);
        default: return moe_ep_combine_recv(h.get(), slot, nullptr, &cr, stream);
      }
    };
    auto poll = [&](std::string* message) -> moe_ep_status_t {
      moe_ep_status_t st = MOE_EP_SUCCESS;
      if (moe_ep_get_async_error(h.get(), &st) != MOE_EP_SUCCESS) return MOE_EP_ERROR_INTERNAL;
      *message = st ? moe_ep_last_error() : "";
      return st;
    };
    // A good round first: every rank, every half.
    for (const GpuStep& step : steps)
      note(issue(step) == MOE_EP_SUCCESS, "good round: " + std::string(moe_ep_last_error()));
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::string m;
    note(poll(&m) == MOE_EP_SUCCESS, "good round: " + m);

    // The round with a missing half.  The halves issued before the wait runs out
    // return SUCCESS; a half that waits on the host may itself answer TIMEOUT,
    // and every half after it must then answer TIMEOUT too.
    bool timed_out = false;
    for (const GpuStep& step : steps) {
      if (rank == missing && step.micro_batch == last && step.half >= skipped) continue;
      const moe_ep_status_t st = issue(step);
      // (On NCCL the skipping rank's own pair may wait behind the missing one in the communicator's order.)
      note(st == MOE_EP_SUCCESS ? !timed_out : st == MOE_EP_ERROR_TIMEOUT && (rank != missing || nccl),
           std::string("half ") + std::to_string(int(step.half)) + " of micro-batch " +
               std::to_string(step.micro_batch) + ": " + moe_ep_status_string(st));
      timed_out = timed_out || st == MOE_EP_ERROR_TIMEOUT;
    }
    // NVLink bounds its waits on the device (or with its own watchdog), so the
    // stream finishes by itself; NCCL's kernels wait without a bound, and the
    // host aborts the communicator when moe_ep_get_async_error (or destroy)
    // waits past timeout_ms: there the poll comes first.
    moe_ep_status_t polled = MOE_EP_SUCCESS;
    const auto timed_poll = [&] {
      const auto start = std::chrono::steady_clock::now();
      polled = poll(&m);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      note(t < limit_s, "moe_ep_get_async_error took " + std::to_string(t) + " s");
    };
    if (nccl) timed_poll();
    cudaError_t stream_status = cudaSuccess;
    if (seconds_until_idle(stream, limit_s, &stream_status) < 0) {
      // The stream never finished: nothing could end this rank's process cleanly.
      std::fprintf(stderr, "rank %d: %s the stream's work had not finished %.1f s (10 x timeout_ms) after the round\n",
                   rank, why.c_str(), limit_s);
      std::fflush(stderr);
      std::_Exit(1);
    }
    note(stream_status == cudaSuccess, std::string("stream: ") + cudaGetErrorName(stream_status));
    if (!nccl) timed_poll();
    const std::string said = std::string(moe_ep_status_string(polled)) + " '" + m + "'";
    if (rank != missing) {
      note(polled == MOE_EP_ERROR_TIMEOUT, "poll: " + said);
      note(m.find("timeout_ms = " + std::to_string(o.timeout_ms)) != std::string::npos, "message " + said);
      if (!nccl) {  // the NVLink backend names the phase and the rank it waited for
        note(m.find(skipped == kDispatchSend ? "dispatch" : "combine") != std::string::npos, "phase in " + said);
        note(names_rank(m, missing), "rank " + std::to_string(missing) + " in " + said);
      }
      // Sticky: the next call fails at once with the same status.
      const moe_ep_status_t again = issue(GpuStep{0, kDispatchSend});
      note(again == MOE_EP_ERROR_TIMEOUT, std::string("a call after the timeout: ") + moe_ep_status_string(again));
    } else if (!nccl) {  // its own pairs had every peer's halves
      note(polled == MOE_EP_SUCCESS, "the skipping rank's poll: " + said);
    }
    const double seconds = h.destroy();  // never waits for a peer
    note(seconds < 5.0, "destroy took " + std::to_string(seconds) + " s");
    cudaStreamDestroy(stream);
  }
  INFO(why);
  REQUIRE(mpi_all(ok));
}

}  // namespace

TEST_CASE("split halves on the GPU: a rank that skips a send half makes the others time out; streams finish",
          "[gpu][split][timeout][multi_rank]") {
  if (mpi_world_size() < 2) {
    skip_case("needs at least two ranks");
    return;
  }
  GpuCaseOptions split;
  split.phases = GpuPhases::split;
  if (halves_supported(split)) {
    check_split_timeout(split, kDispatchSend);
    check_split_timeout(split, kCombineSend);
  }
  GpuCaseOptions zero_copy = split;
  zero_copy.zero_copy_combine = true;
  if (halves_supported(zero_copy)) check_split_timeout(zero_copy, kCombineSend);
  GpuCaseOptions two;
  two.phases = GpuPhases::micro_batches2;  // B's half is missing while A's pair completes
  if (halves_supported(two)) {
    check_split_timeout(two, kDispatchSend);
    check_split_timeout(two, kCombineSend);
  }
  // The group is usable again with fresh handles.
  check_phases(workload(64, 8, 1024, 32, 1111), GpuCaseOptions{});
}
