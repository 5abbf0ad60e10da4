// The moe_ep benchmark's way of timing a call, reproduced: per iteration, on
// each side's stream, an event before the first phase and after every phase
// (a phase is one graph replay or one launch, e.g. dispatch then combine);
// the iterations queued in batches behind a HostGate on every stream and
// released at once, each batch after one untimed iteration that lines the
// sides up; a phase's time is the GPU time between its two events.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cuda_support.cuh"
#include "evented_times.hpp"
#include "probe_measurements.hpp"

namespace moe_ep_probe {

// One side of the timed calls: its stream, and what each phase of one call
// enqueues on it (the stream's device is current while it does).
struct CallSide {
  const Stream* stream;
  std::vector<std::function<void()>> phases;
};

struct EventedPlan {
  int iterations = 0;  // timed iterations per side
  int batch = 16;      // iterations per gate (the benchmark's batch)
  int warmup = 0;      // untimed, ungated iterations first (the first replays upload a graph)
  unsigned long long gate_timeout_ns = 0;
};

// Runs the plan on every side (all sides have the same number of phases).
// After every batch and the warm-up, once the streams have synchronized,
// `check` may return an error (e.g. a device-side wait timed out), which
// stops the loop.
EventedTimes time_evented_calls(const std::vector<CallSide>& sides, const EventedPlan& plan,
                                const std::function<std::string()>& check);

// The plan from --call-iterations, --call-batch and --timeout-ms.
EventedPlan evented_plan(const ProbeOptions& options);

}  // namespace moe_ep_probe
