// The measurement groups of moe_ep_latency_probe (implemented in CUDA, in
// launch_probe.cu, ping_pong_probe.cu, load_probe.cu, exchange_probe.cu and
// bandwidth_probe.cu),
// behind a plain C++ interface so that the options, the report and main need
// no CUDA headers.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "probe_options.hpp"
#include "probe_report.hpp"

namespace moe_ep_probe {

// No CUDA device is usable (no driver, no GPU, or none visible).
class NoDevice : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A CUDA call or launch failed; what() names the call and the error.
class ProbeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The two ends of every cross-GPU measurement: side A initiates, side B answers.
struct Sides {
  int device_a = 0;
  int device_b = 0;
  bool same_gpu = true;
  std::string name_a, name_b;  // "GPU 0 (NVIDIA H200)"
  std::string link;            // what connects them, "same GPU: not NVLink (...)" when they are one
};

// GPUs 0 and 1 with peer access enabled both ways, or GPU 0 twice.
Sides open_sides(bool force_same_gpu);
// The smallest step of %globaltimer seen on side A, in ns.
double measure_globaltimer_tick_ns(const Sides& sides);

std::vector<Measurement> measure_launch(const Sides& sides, const ProbeOptions& options);
std::vector<Measurement> measure_flag_one_way(const Sides& sides, const ProbeOptions& options);
std::vector<Measurement> measure_row_fence_flag(const Sides& sides, const ProbeOptions& options);
std::vector<Measurement> measure_flags_in_data(const Sides& sides, const ProbeOptions& options);
std::vector<Measurement> measure_dependent_loads(const Sides& sides, const ProbeOptions& options);
// Group "call": calls timed as the moe_ep benchmark times them (events around
// each, gated batches): empty kernels, then the minimal two-sided exchange.
std::vector<Measurement> measure_evented_launch(const Sides& sides, const ProbeOptions& options);
std::vector<Measurement> measure_exchange_calls(const Sides& sides, const ProbeOptions& options);
// Group "bw" (bandwidth_probe.cu): GB/s per GPU and per SM of register and
// bulk-copy streams, local and over the peer link, for several grid sizes
// of one block per SM; samples in GB/s.
std::vector<Measurement> measure_sm_bandwidth(const Sides& sides, const ProbeOptions& options);

}  // namespace moe_ep_probe
