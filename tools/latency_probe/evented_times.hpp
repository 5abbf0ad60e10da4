// What the benchmark-style timing of calls (evented_loop.cuh) yields, and the
// line of the report made from it.  Plain C++ (no CUDA), tested on the CPU
// machine.
#pragma once

#include <string>
#include <vector>

#include "probe_report.hpp"

namespace moe_ep_probe {

struct EventedTimes {
  std::vector<std::vector<std::vector<double>>> us;  // [side][phase][iteration], microseconds
  int batches_gate_expired = 0;       // a gate gave up before the host had queued its batch: partly host-paced
  long long iterations_enqueued = 0;  // per side, untimed ones included (each one call of every phase)
  std::string error;                  // from the check after a batch; the loop stopped there
};

// A line from the times: one sample per iteration and phase, the slowest
// side's (as the benchmark reports the slower rank); with several sides each
// side's median (side_a_median_us, ...), with several phases each phase's
// median of the samples (phase_1_median_us, ...), and batches_gate_expired.
// With an error: that error and no samples.  Sides or phases of unequal
// lengths are an error of the line, not undefined behaviour.
Measurement evented_measurement(const std::string& name, const std::string& what, const EventedTimes& times);

}  // namespace moe_ep_probe
