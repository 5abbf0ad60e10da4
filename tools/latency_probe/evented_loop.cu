#include "evented_loop.cuh"

#include <algorithm>
#include <memory>

#include "host_gate.cuh"

namespace moe_ep_probe {

namespace {

using Marks = std::vector<std::unique_ptr<Event>>;

// One call on one side; with `marks`, an event at marks[first] before it and
// one after each phase.
void enqueue_call(const CallSide& side, const Marks* marks, size_t first) {
  DeviceScope scope(side.stream->device());
  const cudaStream_t stream = side.stream->get();
  if (marks != nullptr) PROBE_CUDA(cudaEventRecord((*marks)[first]->get(), stream));
  for (size_t p = 0; p < side.phases.size(); ++p) {
    side.phases[p]();
    if (marks != nullptr) PROBE_CUDA(cudaEventRecord((*marks)[first + p + 1]->get(), stream));
  }
}

void synchronize_all(const std::vector<CallSide>& sides) {
  for (const CallSide& side : sides) side.stream->synchronize();
}

}  // namespace

EventedPlan evented_plan(const ProbeOptions& options) {
  EventedPlan plan;
  plan.iterations = options.call_iterations;
  plan.batch = options.call_batch;
  plan.warmup = options.call_batch;
  plan.gate_timeout_ns = 1000000ull * unsigned(options.timeout_ms);
  return plan;
}

EventedTimes time_evented_calls(const std::vector<CallSide>& sides, const EventedPlan& plan,
                                const std::function<std::string()>& check) {
  const size_t phases = sides.at(0).phases.size();
  for (const CallSide& side : sides) {
    if (side.phases.size() != phases) throw ProbeError("time_evented_calls: the sides' calls differ in phases");
  }
  const size_t marks_per_call = phases + 1;
  EventedTimes out;
  out.us.assign(sides.size(), std::vector<std::vector<double>>(phases));

  for (int w = 0; w < plan.warmup; ++w) {
    for (const CallSide& side : sides) enqueue_call(side, nullptr, 0);
  }
  out.iterations_enqueued += plan.warmup;
  synchronize_all(sides);
  if (!(out.error = check()).empty()) return out;

  std::vector<Marks> marks(sides.size());
  for (size_t s = 0; s < sides.size(); ++s) {
    for (size_t k = 0; k < size_t(plan.batch) * marks_per_call; ++k) {
      marks[s].push_back(std::make_unique<Event>(sides[s].stream->device()));
    }
  }
  HostGate gate;
  for (int done = 0; done < plan.iterations;) {
    const int batch = std::min(plan.batch, plan.iterations - done);
    try {
      for (const CallSide& side : sides) gate.hold(*side.stream, plan.gate_timeout_ns);
      for (const CallSide& side : sides) enqueue_call(side, nullptr, 0);  // untimed: lines the sides up
      // Iteration by iteration, each side in turn, as the ranks' hosts queue them.
      for (int i = 0; i < batch; ++i) {
        for (size_t s = 0; s < sides.size(); ++s) enqueue_call(sides[s], &marks[s], size_t(i) * marks_per_call);
      }
    } catch (...) {
      // Nothing may still poll the gate's host memory when it is freed.
      gate.open();
      for (const CallSide& side : sides) cudaStreamSynchronize(side.stream->get());
      cudaGetLastError();
      throw;
    }
    gate.open();
    synchronize_all(sides);
    out.iterations_enqueued += 1 + batch;
    out.batches_gate_expired += gate.take_expired() ? 1 : 0;
    if (!(out.error = check()).empty()) return out;
    for (size_t s = 0; s < sides.size(); ++s) {
      for (int i = 0; i < batch; ++i) {
        for (size_t p = 0; p < phases; ++p) {
          const size_t k = size_t(i) * marks_per_call + p;
          float ms = 0;
          PROBE_CUDA(cudaEventElapsedTime(&ms, marks[s][k]->get(), marks[s][k + 1]->get()));
          out.us[s][p].push_back(double(ms) * 1000.0);
        }
      }
    }
    done += batch;
  }
  return out;
}

}  // namespace moe_ep_probe
