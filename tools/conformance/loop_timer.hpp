// Times a loop body on every rank.  The body runs one iteration and calls
// marks.mark() at each phase boundary (k phases = k + 1 marks); the timer
// returns, per phase, the duration of every timed iteration in microseconds.
//   GPU:  CUDA events on the session stream; with `gated`, each batch of
//         iterations is queued behind a LaunchGate and released at once on
//         every rank (after an MPI barrier), preceded by one untimed iteration
//         that lines the ranks up.  A batch the host could not queue before
//         the gate gave up is redone with half as many iterations; only when
//         a batch of one does not fit is the loop timed without the gate
//         (LoopResult::gate_expired).
//   host: the steady clock, with an MPI barrier before each iteration.
#pragma once

#include <functional>
#include <initializer_list>
#include <utility>
#include <vector>

#include "session.hpp"
#include "stats.hpp"

namespace moe_ep_tool {

class Marks {
 public:
  virtual ~Marks() = default;
  virtual void mark() = 0;
  // A mark on another stream of the same device (the session stream's marks
  // and these share one clock): a phase that starts on one stream and ends on
  // another measures the time between the two events, which may be negative.
  // On the host: the steady clock, like mark().
  virtual void mark_on(void* stream) = 0;
  // For bodies that must wait on the host mid-iteration (the NCCL count
  // exchange): hold() queues a gate, release() waits for every rank and
  // opens it.  Only in ungated loops.  No-ops on the host.
  virtual void hold() = 0;
  virtual void release() = 0;
};

struct LoopOptions {
  int warmup = 5;
  int iters = 20;
  bool gated = true;
  int batch = 16;  // iterations per gate (keeps the launch queue short)
};

struct LoopResult {
  std::vector<std::vector<double>> phase_us;  // [phase][iteration]
  bool gate_expired = false;                  // not even one iteration could be queued ahead: timed without the gate
};

LoopResult time_loop(const Session& session, const LoopOptions& options, int phases,
                     const std::function<void(Marks&)>& body);

// For each (phase, timing): *timing = reduce_phase of that phase of `t`, and
// *gate_expired = t.gate_expired.  Collective.
void reduce_phases(const World& world, const LoopResult& t, std::initializer_list<std::pair<int, PhaseTiming*>> phases,
                   bool* gate_expired);

}  // namespace moe_ep_tool
