// Group "launch": what a launch costs on the GPU, measured with events around
// back-to-back replays of small CUDA graphs.  Every timed block is queued
// behind a gate kernel that keeps the GPU busy while the host enqueues the
// replays, so the events see the GPU's own rate of starting them, not the
// host's rate of submitting them (one ungated line shows the latter).
//
// Group "call" (its launch half): the same empty kernel timed as the moe_ep
// benchmark times a call, with events around every replay (evented_loop.cuh).
#include <chrono>
#include <string>
#include <vector>

#include "cuda_support.cuh"
#include "evented_loop.cuh"

namespace moe_ep_probe {

namespace {

constexpr unsigned kEmptyKernelThreads = 512;

// With `wait_for_previous` it waits (Programmatic Dependent Launch) for the
// kernel before it in the stream; with `release_next` it lets the next one
// start at once instead of at its own end.
__global__ void empty_kernel(int wait_for_previous, int release_next) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (wait_for_previous) cudaGridDependencySynchronize();
  if (release_next) cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// Busy for duration_ns (global timer): bounded by construction.
__global__ void gate_kernel(unsigned long long duration_ns) {
  const uint64_t start = global_ns();
  while (global_ns() - start < duration_ns) {
  }
}

enum class Chain { one_kernel, two_kernels, two_kernels_pdl, two_kernels_pdl_early_release };

void enqueue_chain(Chain chain, cudaStream_t stream) {
  const bool pdl = chain == Chain::two_kernels_pdl || chain == Chain::two_kernels_pdl_early_release;
  const int release = chain == Chain::two_kernels_pdl_early_release ? 1 : 0;
  launch(empty_kernel, 1, kEmptyKernelThreads, stream, false, 0, release);
  if (chain != Chain::one_kernel) launch(empty_kernel, 1, kEmptyKernelThreads, stream, pdl, pdl ? 1 : 0, 0);
}

GraphExec capture_chain(int device, Chain chain) {
  return capture_graph(device, [chain](cudaStream_t stream) { enqueue_chain(chain, stream); });
}

struct BlockTime {
  double device_us_per_replay;  // events around the replays
  bool host_bound;              // the host needed longer to enqueue them than the gate ran
};

// One timed block of `replays` submissions by `submit` (gated or not).
template <class Submit>
BlockTime time_block(const Stream& stream, const Event& begin, const Event& end, int replays, bool gated,
                     Submit submit) {
  DeviceScope scope(stream.device());
  // Long enough for the host to queue every replay behind it (a submission
  // takes a few microseconds).
  const unsigned long long gate_ns = 1000000ull + 8000ull * unsigned(replays);
  if (gated) launch(gate_kernel, 1, 1, stream.get(), false, gate_ns);
  PROBE_CUDA(cudaEventRecord(begin.get(), stream.get()));
  const auto host_start = std::chrono::steady_clock::now();
  for (int r = 0; r < replays; ++r) submit();
  const double host_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - host_start).count();
  PROBE_CUDA(cudaEventRecord(end.get(), stream.get()));
  PROBE_CUDA(cudaEventSynchronize(end.get()));
  float ms = 0;
  PROBE_CUDA(cudaEventElapsedTime(&ms, begin.get(), end.get()));
  return {double(ms) * 1000.0 / replays, gated && host_ns > double(gate_ns)};
}

struct Variant {
  const char* name;
  const char* what;
  Chain chain;
};

const Variant kVariants[] = {
    {"graph_1_kernel", "one replay of a graph of one empty kernel (1 x 512 threads), replays back to back",
     Chain::one_kernel},
    {"graph_2_kernels_increment", "a second, dependent empty kernel in the graph: replay time minus graph_1_kernel's",
     Chain::two_kernels},
    {"graph_2_kernels_pdl_increment",
     "the second kernel with Programmatic Dependent Launch (waits with cudaGridDependencySynchronize): increment",
     Chain::two_kernels_pdl},
    {"graph_2_kernels_pdl_release_increment",
     "as _pdl, and the first kernel calls cudaTriggerProgrammaticLaunchCompletion at its start: increment",
     Chain::two_kernels_pdl_early_release},
};

}  // namespace

std::vector<Measurement> measure_launch(const Sides& sides, const ProbeOptions& options) {
  const int device = sides.device_a;
  Stream stream(device);
  Event begin(device), end(device);

  // Capture every chain first; a chain the runtime refuses (PDL in a graph
  // needs a recent driver) becomes that line's error, the rest still run.
  std::vector<GraphExec> graphs;
  std::vector<std::string> capture_errors;
  for (const Variant& v : kVariants) {
    try {
      graphs.push_back(capture_chain(device, v.chain));
      capture_errors.emplace_back();
    } catch (const ProbeError& e) {
      graphs.emplace_back();
      capture_errors.emplace_back(e.what());
    }
  }
  if (!capture_errors[0].empty()) throw ProbeError("graph of one kernel: " + capture_errors[0]);

  auto replay = [&](size_t g) { return [&, g]() { PROBE_CUDA(cudaGraphLaunch(graphs[g].get(), stream.get())); }; };
  auto eager = [&]() { launch(empty_kernel, 1, kEmptyKernelThreads, stream.get(), false, 0, 0); };

  // Warm up every graph and the eager path once (first replays upload the graph).
  for (size_t g = 0; g < graphs.size(); ++g) {
    if (capture_errors[g].empty()) time_block(stream, begin, end, 10, false, replay(g));
  }
  time_block(stream, begin, end, 10, false, eager);

  const size_t n = graphs.size();
  std::vector<std::vector<double>> per_replay(n);
  std::vector<int> host_bound(n + 1, 0);
  std::vector<double> ungated, eager_us;
  // Blocks of the variants interleave, so that a slow drift of clocks or
  // host load affects each the same; increments are paired per block.
  for (int block = 0; block < options.graph_blocks; ++block) {
    for (size_t g = 0; g < n; ++g) {
      if (!capture_errors[g].empty()) continue;
      const BlockTime t = time_block(stream, begin, end, options.graph_replays, true, replay(g));
      per_replay[g].push_back(t.device_us_per_replay);
      host_bound[g] += t.host_bound;
    }
    const BlockTime e = time_block(stream, begin, end, options.graph_replays, true, eager);
    eager_us.push_back(e.device_us_per_replay);
    host_bound[n] += e.host_bound;
    ungated.push_back(time_block(stream, begin, end, options.graph_replays, false, replay(0)).device_us_per_replay);
  }

  std::vector<Measurement> out;
  for (size_t g = 0; g < n; ++g) {
    Measurement m{kVariants[g].name, kVariants[g].what, {}, capture_errors[g], {}};
    if (m.error.empty()) {
      if (g == 0) {
        m.samples_us = per_replay[0];
      } else {
        for (size_t b = 0; b < per_replay[g].size(); ++b) m.samples_us.push_back(per_replay[g][b] - per_replay[0][b]);
        m.extras.emplace_back("replay_median_us", summarize(per_replay[g]).median);
      }
      m.extras.emplace_back("blocks_host_bound", host_bound[g]);
    }
    out.push_back(std::move(m));
  }
  out.push_back({"graph_1_kernel_host_paced",
                 "as graph_1_kernel but not queued behind a gate: the rate at which the host submits replays",
                 ungated,
                 "",
                 {}});
  out.push_back({"kernel_launch_eager",
                 "one empty kernel launched without a graph (cudaLaunchKernelEx), queued, back to back",
                 eager_us,
                 "",
                 {{"blocks_host_bound", host_bound[n]}}});
  return out;
}

std::vector<Measurement> measure_evented_launch(const Sides& sides, const ProbeOptions& options) {
  const int device = sides.device_a;
  Stream stream(device);
  // Two graphs of the same kernel: the benchmark alternates two (dispatch, combine).
  const GraphExec first = capture_chain(device, Chain::one_kernel);
  const GraphExec second = capture_chain(device, Chain::one_kernel);
  auto replay = [&](const GraphExec& graph) {
    return [&stream, &graph]() { PROBE_CUDA(cudaGraphLaunch(graph.get(), stream.get())); };
  };
  auto eager = [&]() { launch(empty_kernel, 1, kEmptyKernelThreads, stream.get(), false, 0, 0); };
  const auto no_check = []() { return std::string(); };
  const EventedPlan plan = evented_plan(options);

  std::vector<Measurement> out;
  out.push_back(evented_measurement(
      "graph_evented_1_kernel",
      "graph_1_kernel's graph timed as the benchmark times a call: event, replay, event; gated batches; the "
      "time between the two events",
      time_evented_calls({{&stream, {replay(first)}}}, plan, no_check)));
  out.push_back(evented_measurement(
      "graph_evented_alternating",
      "two graphs of one empty kernel replayed alternately, an event before, between and after (the benchmark's "
      "dispatch/combine iteration); both phases' samples",
      time_evented_calls({{&stream, {replay(first), replay(second)}}}, plan, no_check)));
  out.push_back(evented_measurement("kernel_evented_eager",
                                    "as graph_evented_1_kernel with the empty kernel launched without a graph",
                                    time_evented_calls({{&stream, {eager}}}, plan, no_check)));
  return out;
}

}  // namespace moe_ep_probe
