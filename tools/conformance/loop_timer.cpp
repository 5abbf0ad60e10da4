#include "loop_timer.hpp"

#include <algorithm>
#include <chrono>

#include "errors.hpp"
#include "launch_gate.hpp"

namespace moe_ep_tool {

namespace {

// Queuing a batch takes the host well under this (a few graph launches or
// eager calls per iteration); a gate still closed after it means the host
// waited for the GPU (or a full launch queue) behind the gate.
constexpr double kGateTimeoutMs = 1000;

class NoMarks final : public Marks {
 public:
  void mark() override {}
  void mark_on(void*) override {}
  void hold() override {}
  void release() override {}
};

class HostMarks final : public Marks {
 public:
  explicit HostMarks(std::vector<double>& points) : points_(points) {}
  void mark() override {
    points_.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count());
  }
  void mark_on(void*) override { mark(); }
  void hold() override {}
  void release() override {}

 private:
  std::vector<double>& points_;
};

class EventMarks final : public Marks {
 public:
  EventMarks(const Session& s, std::vector<cudaEvent_t>& events, LaunchGate& gate)
      : s_(s), events_(events), gate_(gate) {}
  void mark() override { mark_on(s_.stream()); }
  void mark_on(void* stream) override {
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      TOOL_CHECK_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
    }
    TOOL_CHECK_CUDA(cudaEventRecord(events_[used_++], static_cast<cudaStream_t>(stream)));
  }
  void hold() override { gate_.close(stream(), kGateTimeoutMs); }
  void release() override {
    s_.world().barrier();
    gate_.open();
  }
  size_t used() const { return used_; }

 private:
  cudaStream_t stream() const { return static_cast<cudaStream_t>(s_.stream()); }
  const Session& s_;
  std::vector<cudaEvent_t>& events_;
  LaunchGate& gate_;
  size_t used_ = 0;
};

// Splits mark times (k + 1 per iteration) into per-phase durations.
void append_phases(const std::vector<double>& points, int phases, LoopResult& out) {
  const size_t per = size_t(phases) + 1;
  for (size_t i = 0; i + per <= points.size(); i += per) {
    for (int p = 0; p < phases; ++p) out.phase_us[p].push_back(points[i + p + 1] - points[i + p]);
  }
}

LoopResult host_loop(const Session& s, const LoopOptions& o, int phases, const std::function<void(Marks&)>& body) {
  LoopResult out;
  out.phase_us.resize(phases);
  NoMarks none;
  for (int i = 0; i < o.warmup; ++i) body(none);
  std::vector<double> points;
  HostMarks marks(points);
  for (int i = 0; i < o.iters; ++i) {
    s.world().barrier();
    body(marks);
  }
  append_phases(points, phases, out);
  return out;
}

LoopResult gpu_loop(const Session& s, const LoopOptions& o, bool gated, int phases,
                    const std::function<void(Marks&)>& body) {
  const auto stream = static_cast<cudaStream_t>(s.stream());
  LoopResult out;
  out.phase_us.resize(phases);
  LaunchGate gate;
  std::vector<cudaEvent_t> events;
  NoMarks none;
  for (int i = 0; i < o.warmup; ++i) body(none);
  TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
  try {
    int batch_size = std::max(1, o.batch);
    for (int done = 0; done < o.iters;) {
      const int batch = std::min(batch_size, o.iters - done);
      EventMarks marks(s, events, gate);
      if (gated) {
        s.world().barrier();  // the bound then counts this batch's queuing, not another rank's lag
        gate.close(stream, kGateTimeoutMs);
        body(none);  // untimed: the collective lines the ranks up
      }
      for (int i = 0; i < batch; ++i) body(marks);
      if (gated) {
        s.world().barrier();
        gate.open();
      }
      TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
      if (gated && s.world().any(gate.expired())) {
        // The batch did not fit ahead of the GPU on some rank (iterations of
        // many kernels fill the launch queue): its times include launch gaps.
        // Redo it with half as many iterations queued at once; only when one
        // iteration does not fit are the launches really host-driven.
        if (batch == 1) {
          out.gate_expired = true;
          break;
        }
        batch_size = std::max(1, batch / 2);
        continue;
      }
      std::vector<double> points(marks.used());
      for (size_t i = 1; i < points.size(); ++i) {
        float ms = 0;
        TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, events[0], events[i]));
        points[i] = 1000.0 * ms;
      }
      append_phases(points, phases, out);
      done += batch;
    }
  } catch (...) {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    throw;
  }
  for (cudaEvent_t e : events) cudaEventDestroy(e);
  return out;
}

}  // namespace

LoopResult time_loop(const Session& s, const LoopOptions& o, int phases, const std::function<void(Marks&)>& body) {
  if (!s.on_gpu()) return host_loop(s, o, phases, body);
  LoopResult r = gpu_loop(s, o, o.gated, phases, body);
  if (o.gated && s.world().any(r.gate_expired)) {
    // The host could not queue even one iteration without the GPU moving (a
    // call that waits for the GPU on the host): time it as it is.
    LoopOptions again = o;
    again.warmup = 0;
    r = gpu_loop(s, again, false, phases, body);
    r.gate_expired = true;
  }
  return r;
}

void reduce_phases(const World& world, const LoopResult& t, std::initializer_list<std::pair<int, PhaseTiming*>> phases,
                   bool* gate_expired) {
  for (const auto& [phase, timing] : phases) *timing = reduce_phase(world, t.phase_us[phase]);
  *gate_expired = t.gate_expired;
}

}  // namespace moe_ep_tool
