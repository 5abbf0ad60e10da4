// moe_ep_latency_probe: measures, each in isolation, the hardware and runtime
// costs that bound a small moe_ep call (docs/latency_budget.md).  It does not
// use libmoe_ep.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "probe_measurements.hpp"
#include "probe_options.hpp"
#include "probe_report.hpp"

namespace {

using namespace moe_ep_probe;

using GroupFn = std::vector<Measurement> (*)(const Sides&, const ProbeOptions&);

// What a group runs, in order; each part fails on its own.
std::vector<GroupFn> group_parts(const std::string& group) {
  if (group == "launch") return {measure_launch};
  if (group == "flag") return {measure_flag_one_way};
  if (group == "row") return {measure_row_fence_flag};
  if (group == "ll") return {measure_flags_in_data};
  if (group == "call") return {measure_evented_launch, measure_exchange_calls};
  if (group == "bw") return {measure_sm_bandwidth};
  return {measure_dependent_loads};
}

RunInfo run_info(const Sides& sides, const ProbeOptions& o) {
  RunInfo info;
  info.side_a = sides.name_a;
  info.side_b = sides.name_b;
  info.link = sides.link;
  info.same_gpu = sides.same_gpu;
  info.config = {
      {"round_trips", o.round_trips},         {"warmup_trips", o.warmup_trips}, {"kernel_runs", o.kernel_runs},
      {"graph_replays", o.graph_replays},     {"graph_blocks", o.graph_blocks}, {"chase_loads", o.chase_loads},
      {"call_iterations", o.call_iterations}, {"call_batch", o.call_batch},     {"timeout_ms", o.timeout_ms}};
  return info;
}

int run(const ProbeOptions& options) {
  // Open the JSON file before measuring, so that a bad path costs no GPU time.
  std::ofstream json;
  if (!options.json_path.empty()) {
    json.open(options.json_path);
    if (!json) {
      std::cerr << "moe_ep_latency_probe: --json: cannot open '" << options.json_path << "' for writing\n";
      return kExitBadArguments;
    }
  }
  Sides sides;
  try {
    sides = open_sides(options.same_gpu);
  } catch (const NoDevice& e) {
    std::cerr << "moe_ep_latency_probe: no CUDA device: " << e.what() << "\n";
    if (json.is_open()) {  // nothing measured: leave no empty file behind
      json.close();
      std::remove(options.json_path.c_str());
    }
    return kExitNoDevice;
  } catch (const ProbeError& e) {
    std::cerr << "moe_ep_latency_probe: cannot set up the GPUs: " << e.what() << "\n";
    return kExitMeasurementFailed;
  }
  RunInfo info = run_info(sides, options);
  try {
    info.globaltimer_tick_ns = measure_globaltimer_tick_ns(sides);
  } catch (const ProbeError& e) {
    std::cerr << "moe_ep_latency_probe: global timer step not measured: " << e.what() << "\n";
  }

  std::vector<Measurement> results;
  for (const std::string& group : options.groups) {
    std::cerr << "moe_ep_latency_probe: measuring " << group << "\n";
    for (GroupFn part : group_parts(group)) {
      try {
        for (Measurement& m : part(sides, options)) results.push_back(std::move(m));
      } catch (const ProbeError& e) {
        results.push_back({group, "the whole group or a part of it (a CUDA call failed)", {}, e.what(), {}});
      }
    }
  }

  print_table(std::cout, info, results);
  if (json.is_open()) {
    write_json(json, info, results);
    json.close();
    if (!json) {
      std::cerr << "moe_ep_latency_probe: writing '" << options.json_path << "' failed\n";
      return kExitMeasurementFailed;
    }
  }
  for (const Measurement& m : results) {
    if (!m.error.empty()) return kExitMeasurementFailed;
  }
  return kExitMeasured;
}

}  // namespace

int main(int argc, char** argv) {
  ProbeOptions options;
  try {
    options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const OptionError& e) {
    std::cerr << "moe_ep_latency_probe: " << e.what() << "\n";
    return kExitBadArguments;
  }
  if (options.help) {
    std::cout << usage_text();
    return kExitMeasured;
  }
  try {
    return run(options);
  } catch (const std::exception& e) {  // e.g. out of host memory
    std::cerr << "moe_ep_latency_probe: " << e.what() << "\n";
    return kExitMeasurementFailed;
  }
}
