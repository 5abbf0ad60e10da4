// Command line of moe_ep_latency_probe: what to measure, how often, and where
// the JSON goes.  Parsing is plain C++ (no CUDA) so that it is testable on a
// machine without a GPU.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace moe_ep_probe {

// Exit status of the probe (also in --help).
enum ExitCode : int { kExitMeasured = 0, kExitMeasurementFailed = 1, kExitBadArguments = 2, kExitNoDevice = 3 };

// The measurement groups, in the order they run and print.
inline const std::vector<std::string>& all_groups() {
  static const std::vector<std::string> groups = {"launch", "flag", "row", "ll", "load", "call", "bw"};
  return groups;
}

struct ProbeOptions {
  int round_trips = 10000;   // timed round trips per ping-pong kernel (rounds per exchange-loop kernel)
  int warmup_trips = 100;    // untimed round trips before them (both kernels started, caches warm)
  int kernel_runs = 3;       // ping-pong / exchange-loop / pointer-chase kernels per variant; samples pooled
  int graph_replays = 1000;  // graph replays per timed block
  int graph_blocks = 30;     // timed blocks per graph (one sample each)
  int chase_loads = 4000;    // dependent loads per pointer chase
  int call_iterations = 2000;  // timed calls per "call" line (events around each)
  int call_batch = 16;         // calls queued per gate: the benchmark's batch
  int timeout_ms = 1000;     // bound of every device-side wait
  bool same_gpu = false;     // both sides on GPU 0 even where GPU 1 exists
  std::vector<std::string> groups = all_groups();
  std::string json_path;  // empty: no JSON
  bool help = false;
};

// A command line that cannot be run; what() names the argument, what was
// expected and what was given.
class OptionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

ProbeOptions parse_options(const std::vector<std::string>& args);
std::string usage_text();

}  // namespace moe_ep_probe
