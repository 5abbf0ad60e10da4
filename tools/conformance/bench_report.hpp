// The benchmark's output: nccl-tests-like header lines, one row per size as
// it is measured, the baselines side by side with ratios, a footer, and JSON.
#pragma once

#include <string>
#include <vector>

#include "bench_command.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

class BenchReport {
 public:
  BenchReport(const Session& session, const BenchOptions& options, const WorkloadSpec& shape, bool graph,
              bool ceiling, bool nccl);

  void print_header();  // collective (gathers the per-rank lines)
  void print_row(const SizeResult& r) const;
  void print_baselines(const std::vector<SizeResult>& results) const;
  // Prints the #wrong summary and the average bus bandwidth; false on any wrong element.
  bool print_footer(const std::vector<SizeResult>& results) const;
  void write_json(const std::vector<SizeResult>& results, const std::string& path) const;  // collective

 private:
  std::string mode() const;  // "CUDA-graph replay" or "eager calls"
  std::vector<std::string> formulas() const;  // the byte formulas in this backend's words
  const Session& s_;
  const BenchOptions& o_;
  WorkloadSpec shape_;
  bool graph_, ceiling_, nccl_;
};

}  // namespace moe_ep_tool
