// Results of moe_ep_latency_probe: the statistics of each measurement's
// samples, the text table and the JSON file.  Plain C++ (no CUDA), tested on
// the CPU machine.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace moe_ep_probe {

// One measured quantity: its samples (in microseconds unless `unit` says
// otherwise), or why it has none.
struct Measurement {
  std::string name;  // stable key, e.g. "flag_one_way_relaxed"
  std::string what;  // one line for the reader
  std::vector<double> samples_us;
  std::string error;  // empty: measured
  // Further figures of the same measurement (e.g. the mean from the global
  // timer as a cross-check of the per-sample clock), in microseconds unless
  // the key says otherwise.
  std::vector<std::pair<std::string, double>> extras;
  // The samples' unit: "us" (every latency line) or "GB/s" (group bw).  The
  // table marks a line in another unit; the JSON gives it on that line.
  std::string unit = "us";
};

struct Summary {
  size_t count = 0;
  double median = 0, p10 = 0, p90 = 0, mean = 0, min = 0, max = 0;
};

// Percentile q in [0, 1] of ascending samples, linear between the two nearest
// ranks (q = 0.5 of {1, 2, 3, 4} is 2.5).  Empty input: 0.
double percentile_sorted(const std::vector<double>& sorted, double q);
Summary summarize(std::vector<double> samples);

// What the run measured on: printed above the table and stored in the JSON.
struct RunInfo {
  std::string side_a;  // "GPU 0 (NVIDIA H200)"
  std::string side_b;
  std::string link;  // "NVLink peer access (GPU 0 <-> GPU 1)" or "same GPU: not NVLink"
  bool same_gpu = false;
  double globaltimer_tick_ns = 0;  // smallest step of %globaltimer seen; 0: not measured
  std::vector<std::pair<std::string, long>> config;
};

void print_table(std::ostream& out, const RunInfo& info, const std::vector<Measurement>& results);
void write_json(std::ostream& out, const RunInfo& info, const std::vector<Measurement>& results);
std::string json_string(const std::string& text);  // quoted and escaped

}  // namespace moe_ep_probe
