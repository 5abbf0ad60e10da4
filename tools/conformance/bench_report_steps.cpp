// BenchReport's tables and JSON for --decode-step and --overlap-gemm
// (the sweep's are in bench_report.cpp).
#include <cstdio>

#include "bench_report.hpp"
#include "dtypes.hpp"
#include "stand_in_expert.hpp"

namespace moe_ep_tool {

namespace {

std::string wrong_text(int64_t wrong) { return wrong < 0 ? "N/A" : std::to_string(wrong); }

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

const char* timing_words(const Session& s, const BenchOptions& o) {
  return !s.on_gpu()     ? "host time (steady clock), slowest rank per iteration"
         : o.launch_gate ? "GPU time (CUDA events, launches queued ahead), slowest rank per iteration"
                         : "CUDA events, launched as the host goes, slowest rank per iteration";
}

// The bytes that leave a rank in each phase at this size (the sweep's remote bytes).
void write_remote_bytes(JsonWriter& j, const Traffic& t) {
  j.key("bytes").begin_object();
  j.field("dispatch_remote", t.mean_remote_bytes(t.dispatch_row_bytes));
  j.field("combine_remote", t.mean_remote_bytes(t.combine_row_bytes));
  j.end_object();
}

}  // namespace

void BenchReport::print_decode_step_columns() const {
  if (!s_.world().is_root()) return;
  const WorkloadSpec& w = shape_;
  std::printf("#\n# decode step: dispatch -> stand-in expert -> combine%s\n",
              graph_ ? ", captured in one CUDA graph" : ", eager calls (-G captures the step in one CUDA graph)");
  std::printf(
      "#   stand-in expert: y = %g * x per element of every received row (NaN, inf, subnormal -> 0), %s -> %s%s\n",
      double(kStandInExpertScale), dtype_name(w.hidden_dtype).c_str(), dtype_name(w.combine_dtype).c_str(),
      o_.zero_copy_combine ? ", written into the dispatch result's combine_input view" : "");
  std::printf(
      "#   step = the whole step; dispatch, expert, combine = each part alone (%s), in the same loop;\n"
      "#   sum = dispatch + expert + combine per iteration; %s\n",
      graph_ ? "a replay of its own graph" : "an eager call", timing_words(s_, o_));
  std::printf(
      "#   #wrong: dispatch / combine after the parts / combine after the step (on other inputs), "
      "against the oracle with the stand-in modelled\n#\n");
  std::printf("# %7s | %8s %8s %8s %8s | %8s %8s %8s | %8s %8s | %s\n", "tokens", "dispatch", "expert", "combine",
              "sum", "step", "p50", "p99", "sum-step", "step/sum", "#wrong");
  std::printf("# %7s | %8s %8s %8s %8s | %8s %8s %8s | %8s %8s |\n", "/rank", "(us)", "(us)", "(us)", "(us)", "(us)",
              "(us)", "(us)", "(us)", "");
  std::fflush(stdout);
}

void BenchReport::print_decode_step_row(const DecodeStepResult& r) const {
  if (!s_.world().is_root()) return;
  std::printf("  %7d | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %8.2f %8.3f | %s/%s/%s%s\n", r.tokens,
              r.dispatch.step.avg, r.expert.step.avg, r.combine.step.avg, r.parts.step.avg, r.step.step.avg,
              r.step.step.p50, r.step.step.p99, r.parts.step.avg - r.step.step.avg,
              ratio(r.step.step.avg, r.parts.step.avg), wrong_text(r.wrong_dispatch).c_str(),
              wrong_text(r.wrong_parts).c_str(), wrong_text(r.wrong_step).c_str(),
              r.gate_expired ? "  (launches could not be queued ahead: host-bound times)" : "");
  std::fflush(stdout);
}

void BenchReport::print_overlap_skipped(const std::string& why) const {
  if (s_.world().is_root()) std::printf("#\n# overlap with a GEMM: skipped: %s\n", why.c_str());
}

void BenchReport::print_overlap_columns(int gemm_sm_target, bool auto_shape) const {
  if (!s_.world().is_root()) return;
  const int num_sms = o_.common.num_sms;
  std::printf("#\n# overlap: dispatch + combine (%s, num_sms %s, greatest-priority stream) beside a cuBLAS bf16 GEMM\n",
              graph_ ? "CUDA-graph replays" : "eager calls", num_sms ? std::to_string(num_sms).c_str() : "auto");
  std::printf("#   GEMM: C[M,N] = A[M,K] B[K,N], fp32 accumulation, least-priority stream, %s; %s\n",
              gemm_sm_target ? ("cublasSetSmCountTarget " + std::to_string(gemm_sm_target) + " (the other SMs)").c_str()
                             : "all SMs (no --num-sms)",
              auto_shape ? "N = K = 8192, M chosen per size so that the GEMM alone takes about dispatch + combine alone"
                         : "shape from --gemm-mnk");
  std::printf(
      "#   alone: the GEMM, then dispatch and combine, one after the other; beside: both started together, "
      "each timed on its own stream;\n#   wall: from that start until both are done; serial = GEMM alone + "
      "pair alone; slow = beside / alone; %s\n#\n",
      timing_words(s_, o_));
  std::printf("# %7s | %20s | %8s %8s %6s | %8s %8s | %8s %8s | %8s %8s %6s | %8s %8s %6s | %s\n", "tokens", "GEMM",
              "gemm", "beside", "slow", "dispatch", "beside", "combine", "beside", "pair", "beside", "slow", "wall",
              "serial", "ratio", "#wrong");
  std::printf("# %7s | %20s | %8s %8s %6s | %8s %8s | %8s %8s | %8s %8s %6s | %8s %8s %6s |\n", "/rank", "M x N x K",
              "(us)", "(us)", "", "(us)", "(us)", "(us)", "(us)", "(us)", "(us)", "", "(us)", "(us)", "");
  std::fflush(stdout);
}

void BenchReport::print_overlap_row(const OverlapResult& r) const {
  if (!s_.world().is_root()) return;
  char shape[64];
  std::snprintf(shape, sizeof shape, "%d x %d x %d", r.gemm.m, r.gemm.n, r.gemm.k);
  const double serial = r.gemm_alone.step.avg + r.pair_alone.step.avg;
  std::printf(
      "  %7d | %20s | %8.1f %8.1f %6.3f | %8.1f %8.1f | %8.1f %8.1f | %8.1f %8.1f %6.3f | %8.1f %8.1f %6.3f | "
      "%s/%s%s\n",
      r.tokens, shape, r.gemm_alone.step.avg, r.gemm_beside.step.avg,
      ratio(r.gemm_beside.step.avg, r.gemm_alone.step.avg), r.dispatch_alone.step.avg, r.dispatch_beside.step.avg,
      r.combine_alone.step.avg, r.combine_beside.step.avg, r.pair_alone.step.avg, r.pair_beside.step.avg,
      ratio(r.pair_beside.step.avg, r.pair_alone.step.avg), r.wall.step.avg, serial, ratio(r.wall.step.avg, serial),
      wrong_text(r.wrong_dispatch).c_str(), wrong_text(r.wrong_combine).c_str(),
      r.gate_expired ? "  (launches could not be queued ahead: host-bound times)" : "");
  std::fflush(stdout);
}

void BenchReport::write_decode_step_json(JsonWriter& j, const std::vector<DecodeStepResult>& results) const {
  j.key("decode_step").begin_object();
  j.field("graph", graph_).field("expert_scale", double(kStandInExpertScale));
  j.field("expert",
          "y = scale * x per element of every received row (NaN, inf, subnormal -> 0), written as "
          "combine_dtype" +
              std::string(o_.zero_copy_combine ? " into the combine_input view" : " into a tool buffer"));
  j.key("results").begin_array();
  for (const DecodeStepResult& r : results) {
    j.begin_object();
    j.field("tokens_per_rank", r.tokens);
    write_remote_bytes(j, r.traffic);
    write_phase_json(j, "dispatch", r.dispatch, -1, -1);
    write_phase_json(j, "expert", r.expert, -1, -1);
    write_phase_json(j, "combine", r.combine, -1, -1);
    write_phase_json(j, "parts_sum", r.parts, -1, -1);
    write_phase_json(j, "step", r.step, -1, -1);
    j.field("step_over_parts_sum", ratio(r.step.step.avg, r.parts.step.avg));
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_parts", r.wrong_parts).field("wrong_step", r.wrong_step);
    j.field("launches_queued_ahead", !r.gate_expired);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

void BenchReport::write_overlap_json(JsonWriter& j, const BenchResults& all) const {
  j.key("overlap").begin_object();
  if (!all.overlap_skipped.empty()) j.field("skipped", all.overlap_skipped);
  j.field("graph", graph_).field("num_sms", o_.common.num_sms);
  j.key("results").begin_array();
  for (const OverlapResult& r : all.overlap) {
    j.begin_object();
    j.field("tokens_per_rank", r.tokens);
    write_remote_bytes(j, r.traffic);
    j.key("gemm").begin_object();
    j.field("m", r.gemm.m).field("n", r.gemm.n).field("k", r.gemm.k).field("dtype", "bf16");
    j.field("sm_target", r.gemm_sm_target).field("auto_shape", r.gemm_auto_shape);
    j.field("alone_TFLOPs", r.gemm_alone.step.avg > 0 ? r.gemm.flops() / r.gemm_alone.step.avg / 1e6 : 0.0);
    j.end_object();
    write_phase_json(j, "gemm_alone", r.gemm_alone, -1, -1);
    write_phase_json(j, "dispatch_alone", r.dispatch_alone, -1, -1);
    write_phase_json(j, "combine_alone", r.combine_alone, -1, -1);
    write_phase_json(j, "pair_alone", r.pair_alone, -1, -1);
    write_phase_json(j, "gemm_beside", r.gemm_beside, -1, -1);
    write_phase_json(j, "dispatch_beside", r.dispatch_beside, -1, -1);
    write_phase_json(j, "combine_beside", r.combine_beside, -1, -1);
    write_phase_json(j, "pair_beside", r.pair_beside, -1, -1);
    write_phase_json(j, "wall", r.wall, -1, -1);
    const double serial = r.gemm_alone.step.avg + r.pair_alone.step.avg;
    j.field("gemm_slowdown", ratio(r.gemm_beside.step.avg, r.gemm_alone.step.avg));
    j.field("dispatch_slowdown", ratio(r.dispatch_beside.step.avg, r.dispatch_alone.step.avg));
    j.field("combine_slowdown", ratio(r.combine_beside.step.avg, r.combine_alone.step.avg));
    j.field("pair_slowdown", ratio(r.pair_beside.step.avg, r.pair_alone.step.avg));
    j.field("serial_us", serial).field("wall_over_serial", ratio(r.wall.step.avg, serial));
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_combine", r.wrong_combine);
    j.field("launches_queued_ahead", !r.gate_expired);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

}  // namespace moe_ep_tool
