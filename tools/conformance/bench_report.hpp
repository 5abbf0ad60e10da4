// The benchmark's output: nccl-tests-like header lines, one row per size as
// it is measured, the baselines side by side with ratios, a footer, and JSON.
// The tables and JSON of the modes that replace the sweep: bench_report_steps.cpp.
#pragma once

#include <string>
#include <vector>

#include "bench_command.hpp"
#include "json_writer.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

class BenchReport {
 public:
  // graph: CUDA-graph replays (-G on a GPU backend).
  BenchReport(const Session& session, const BenchOptions& options, const WorkloadSpec& shape, bool graph);

  void print_header();  // collective (gathers the per-rank lines)
  // The sweep.
  void set_baselines(bool ceiling, bool nccl);
  void print_sweep_columns() const;
  void print_row(const SizeResult& r) const;
  void print_baselines(const std::vector<SizeResult>& results) const;
  // --layout: the heading of one layout's table (its workspace; largest: its
  // largest workload; sizing: how its capacity or rows were chosen), and the
  // layouts side by side after the last one.
  void print_layout_heading(const WorkloadSpec& largest, const std::string& layout, const std::string& sizing) const;
  void print_layouts(const std::vector<SizeResult>& results) const;
  // --wire: the heading of one wire's table (what crosses per row; largest:
  // its largest workload), and the wires side by side after the last one.
  void print_wire_heading(const WorkloadSpec& largest, const std::string& wire) const;
  void print_wires(const std::vector<SizeResult>& results) const;
  // One "# <line>" (root only).
  void print_note(const std::string& line) const;
  // A mode that cannot run here: "# <what>: skipped: <why>".
  void print_skipped(const std::string& what, const std::string& why) const;
  // --decode-step (split_refusal: why the split step is not measured, "" = it is).
  void print_decode_step_columns(const std::string& split_refusal) const;
  void print_decode_step_row(const DecodeStepResult& r) const;
  // --overlap-gemm.
  void print_overlap_columns(int gemm_sm_target, bool auto_shape) const;
  void print_overlap_row(const OverlapResult& r) const;
  // --micro-batch-overlap.
  void print_micro_batch_columns(int gemm_sm_target) const;
  void print_micro_batch_row(const MicroBatchResult& r) const;
  // --no-sm-held.
  void print_no_sm_held_columns(const GemmShape& gemm) const;
  void print_no_sm_held_row(const NoSmHeldResult& r) const;
  // Prints the #wrong summary (and the sweep's average bus bandwidth); false on any wrong element.
  bool print_footer(const BenchResults& results) const;
  void write_json(const BenchResults& results, const std::string& path) const;  // collective

 private:
  std::string mode() const;  // "CUDA-graph replay" or "eager calls"
  std::vector<std::string> formulas() const;  // the byte formulas in this backend's words
  void write_decode_step_json(JsonWriter& j, const BenchResults& results) const;
  void write_overlap_json(JsonWriter& j, const BenchResults& results) const;
  void write_micro_batch_json(JsonWriter& j, const BenchResults& results) const;
  void write_no_sm_held_json(JsonWriter& j, const BenchResults& results) const;
  const Session& s_;
  const BenchOptions& o_;
  WorkloadSpec shape_;
  bool graph_, ceiling_ = false, nccl_ = false;
};

// One phase's figures as a JSON object `name` (bytes < 0: no bandwidth field).
void write_phase_json(JsonWriter& j, const std::string& name, const PhaseTiming& t, double remote_bytes,
                      double alg_bytes);

// Bytes/us as GB/s (0 for a zero time).
double gbps(double bytes, double us);

}  // namespace moe_ep_tool
