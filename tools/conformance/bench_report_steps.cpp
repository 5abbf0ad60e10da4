// BenchReport's tables and JSON for --decode-step, --overlap-gemm,
// --micro-batch-overlap and --no-sm-held (the sweep's are in bench_report.cpp).
#include <algorithm>
#include <cstdio>

#include "bench_report.hpp"
#include "dtypes.hpp"
#include "stand_in_expert.hpp"

namespace moe_ep_tool {

namespace {

std::string wrong_text(int64_t wrong) { return wrong < 0 ? "N/A" : std::to_string(wrong); }

double ratio(double a, double b) { return b > 0 ? a / b : 0; }

const char* gate_note(bool expired) {
  return expired ? "  (launches could not be queued ahead: host-bound times)" : "";
}

void write_gemm_json(JsonWriter& j, const std::string& name, const GemmShape& g, int sm_target, double alone_us) {
  j.key(name).begin_object();
  j.field("m", g.m).field("n", g.n).field("k", g.k).field("dtype", "bf16").field("sm_target", sm_target);
  if (alone_us >= 0) j.field("alone_TFLOPs", alone_us > 0 ? g.flops() / alone_us / 1e6 : 0.0);
  j.end_object();
}

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

void BenchReport::print_decode_step_columns(const std::string& split_refusal) const {
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
  if (split_refusal.empty()) {
    std::printf(
        "#   split = the same step through the halves (dispatch_send; dispatch_recv; expert; combine_send; "
        "combine_recv, slot 0 of the same handle)%s\n",
        graph_ ? ", one CUDA graph" : "");
  } else {
    std::printf("#   split step: skipped: %s\n", split_refusal.c_str());
  }
  std::printf(
      "#   #wrong: dispatch / combine after the parts / after the step / after the split step (each step on other "
      "inputs), against the oracle with the stand-in modelled\n#\n");
  std::printf("# %7s | %8s %8s %8s %8s | %8s %8s %8s | %8s %8s | %8s %8s %8s | %s\n", "tokens", "dispatch", "expert",
              "combine", "sum", "step", "p50", "p99", "sum-step", "step/sum", "split", "p50", "split/st", "#wrong");
  std::printf("# %7s | %8s %8s %8s %8s | %8s %8s %8s | %8s %8s | %8s %8s %8s |\n", "/rank", "(us)", "(us)", "(us)",
              "(us)", "(us)", "(us)", "(us)", "(us)", "", "(us)", "(us)", "");
  std::fflush(stdout);
}

void BenchReport::print_decode_step_row(const DecodeStepResult& r) const {
  if (!s_.world().is_root()) return;
  char split[64];
  if (r.has_split) {
    std::snprintf(split, sizeof split, "%8.2f %8.2f %8.3f", r.split_step.step.avg, r.split_step.step.p50,
                  ratio(r.split_step.step.avg, r.step.step.avg));
  } else {
    std::snprintf(split, sizeof split, "%8s %8s %8s", "-", "-", "-");
  }
  char weights[96] = "";
  if (r.expert_groups > 0) {  // the grouped-GEMM expert: what its time is made of
    std::snprintf(weights, sizeof weights, " | weights: %d groups, %.2f GB, %.2f TB/s", r.expert_groups,
                  double(r.expert_weight_bytes) / 1e9, ratio(double(r.expert_weight_bytes) / 1e6, r.expert.step.avg));
  }
  std::printf("  %7d | %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f | %8.2f %8.3f | %s | %s/%s/%s/%s%s%s\n", r.tokens,
              r.dispatch.step.avg, r.expert.step.avg, r.combine.step.avg, r.parts.step.avg, r.step.step.avg,
              r.step.step.p50, r.step.step.p99, r.parts.step.avg - r.step.step.avg,
              ratio(r.step.step.avg, r.parts.step.avg), split, wrong_text(r.wrong_dispatch).c_str(),
              wrong_text(r.wrong_parts).c_str(), wrong_text(r.wrong_step).c_str(),
              wrong_text(r.wrong_split_step).c_str(), weights, gate_note(r.gate_expired));
  std::fflush(stdout);
}

void BenchReport::print_skipped(const std::string& what, const std::string& why) const {
  if (s_.world().is_root()) std::printf("#\n# %s: skipped: %s\n", what.c_str(), why.c_str());
  std::fflush(stdout);
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
      wrong_text(r.wrong_dispatch).c_str(), wrong_text(r.wrong_combine).c_str(), gate_note(r.gate_expired));
  std::fflush(stdout);
}

void BenchReport::write_decode_step_json(JsonWriter& j, const BenchResults& all) const {
  const std::vector<DecodeStepResult>& results = all.decode_step;
  j.key("decode_step").begin_object();
  if (!all.decode_split_skipped.empty()) j.field("split_skipped", all.decode_split_skipped);
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
    if (r.has_split) {
      write_phase_json(j, "split_step", r.split_step, -1, -1);
      j.field("split_over_step", ratio(r.split_step.step.avg, r.step.step.avg));
      j.field("wrong_split_step", r.wrong_split_step);
    }
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_parts", r.wrong_parts).field("wrong_step", r.wrong_step);
    j.field("launches_queued_ahead", !r.gate_expired);
    if (r.expert_groups > 0) {
      j.field("expert_groups", r.expert_groups).field("expert_weight_bytes", int64_t(r.expert_weight_bytes));
    }
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
    write_gemm_json(j, "gemm", r.gemm, r.gemm_sm_target, r.gemm_alone.step.avg);
    j.field("gemm_auto_shape", r.gemm_auto_shape);
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

void BenchReport::print_micro_batch_columns(int gemm_sm_target) const {
  if (!s_.world().is_root()) return;
  const int I = o_.expert_intermediate, H = shape_.hidden_size;
  std::printf(
      "#\n# micro-batch overlap: a step of two micro-batches A and B of T/2 tokens per rank, one handle with "
      "config.micro_batches = 2, %s\n",
      graph_ ? "each measured phase one CUDA graph" : "eager calls");
  std::printf(
      "#   each micro-batch: dispatch -> its experts' GEMMs -> combine; GEMMs: up M x %d x %d, down M x %d x %d "
      "(%s), M = %s (max over ranks shown)\n",
      2 * I, H, H, I,
      !s_.on_gpu()     ? "fp32 loop on the host"
      : gemm_sm_target ? ("cuBLAS bf16, cublasSetSmCountTarget " + std::to_string(gemm_sm_target)).c_str()
                       : "cuBLAS bf16, all SMs",
      o_.expert_rows == "rows" ? "its received rows" : "the picks its received rows hold for this rank's experts");
  std::printf(
      "#   step: A.dispatch_send B.dispatch_send A.dispatch_recv GEMM(A) B.dispatch_recv A.combine_send GEMM(B) "
      "A.combine_recv B.combine_send B.combine_recv;\n"
      "#         halves on a greatest-priority stream, GEMMs on a least-priority one, GEMM(X) after "
      "X.dispatch_recv, X.combine_send after GEMM(X)\n");
  std::printf(
      "#   fused: A.dispatch GEMM(A) A.combine B.dispatch GEMM(B) B.combine on one stream; comm: the step's halves "
      "without GEMMs; compute: the GEMMs alone;\n#   step/max = step / max(comm, compute); %s\n",
      timing_words(s_, o_));
  std::printf(
      "#   #wrong: dispatch / combine (the halves eagerly, in the step's order) / combine after one step "
      "(other inputs), both micro-batches, against the oracle\n#\n");
  std::printf("# %7s | %7s %7s | %9s %9s %9s | %9s | %9s %9s | %8s %8s | %s\n", "tokens", "M(A)", "M(B)", "step", "p50",
              "p99", "fused", "comm", "compute", "step/max", "st/fused", "#wrong");
  std::printf("# %7s | %7s %7s | %9s %9s %9s | %9s | %9s %9s | %8s %8s |\n", "/rank", "", "", "(us)", "(us)", "(us)",
              "(us)", "(us)", "(us)", "", "");
  std::fflush(stdout);
}

namespace {
double max_comm_compute(const MicroBatchResult& r) { return std::max(r.comm.step.avg, r.compute.step.avg); }
}  // namespace

void BenchReport::print_micro_batch_row(const MicroBatchResult& r) const {
  if (!s_.world().is_root()) return;
  std::printf("  %7d | %7lld %7lld | %9.1f %9.1f %9.1f | %9.1f | %9.1f %9.1f | %8.3f %8.3f | %s/%s/%s%s\n", r.tokens,
              static_cast<long long>(r.m[0]), static_cast<long long>(r.m[1]), r.step.step.avg, r.step.step.p50,
              r.step.step.p99, r.fused.step.avg, r.comm.step.avg, r.compute.step.avg,
              ratio(r.step.step.avg, max_comm_compute(r)), ratio(r.step.step.avg, r.fused.step.avg),
              wrong_text(r.wrong_dispatch).c_str(), wrong_text(r.wrong_combine).c_str(),
              wrong_text(r.wrong_step).c_str(), gate_note(r.gate_expired));
  std::fflush(stdout);
}

void BenchReport::print_no_sm_held_columns(const GemmShape& g) const {
  if (!s_.world().is_root()) return;
  std::printf(
      "#\n# no SM held: a cuBLAS bf16 GEMM %d x %d x %d on every SM, between a send half and its receive "
      "half (%s)\n",
      g.m, g.n, g.k, graph_ ? "each half a CUDA graph" : "eager calls");
  std::printf(
      "#   send half, then the GEMM on another stream once the send half is done; the receive half right behind "
      "the send half on its stream;\n"
      "#   every rank but rank 0 starts its send half `delay` later (a host function, no SM), so rank 0's receive "
      "half waits beside the whole GEMM\n");
  std::printf("#   speed = GEMM alone / GEMM between the halves (target >= 0.97); %s\n", timing_words(s_, o_));
  std::printf("#   #wrong: dispatch / combine through the halves (slot 0), once, against the oracle\n#\n");
  std::printf("# %7s | %9s | %9s %7s | %9s %7s | %9s | %s\n", "tokens", "alone", "dispatch", "speed", "combine",
              "speed", "delay", "#wrong");
  std::printf("# %7s | %9s | %9s %7s | %9s %7s | %9s |\n", "/rank", "(us)", "(us)", "", "(us)", "", "(us)");
  std::fflush(stdout);
}

void BenchReport::print_no_sm_held_row(const NoSmHeldResult& r) const {
  if (!s_.world().is_root()) return;
  std::printf("  %7d | %9.1f | %9.1f %7.3f | %9.1f %7.3f | %9.1f | %s/%s%s\n", r.tokens, r.gemm_alone.step.avg,
              r.gemm_in_dispatch.step.avg, ratio(r.gemm_alone.step.avg, r.gemm_in_dispatch.step.avg),
              r.gemm_in_combine.step.avg, ratio(r.gemm_alone.step.avg, r.gemm_in_combine.step.avg), r.delay_us,
              wrong_text(r.wrong_dispatch).c_str(), wrong_text(r.wrong_combine).c_str(), gate_note(r.gate_expired));
  std::fflush(stdout);
}

void BenchReport::write_micro_batch_json(JsonWriter& j, const BenchResults& all) const {
  j.key("micro_batch_overlap").begin_object();
  if (!all.micro_batch_skipped.empty()) j.field("skipped", all.micro_batch_skipped);
  j.field("graph", graph_).field("num_sms", o_.common.num_sms).field("expert_intermediate", all.expert_intermediate);
  j.field("expert_rows", all.expert_rows);
  j.field("gemm", s_.on_gpu() ? "cuBLAS bf16" : "fp32 loop on the host");
  j.field("schedule",
          "A.dispatch_send B.dispatch_send A.dispatch_recv GEMM(A) B.dispatch_recv A.combine_send GEMM(B) "
          "A.combine_recv B.combine_send B.combine_recv");
  j.key("results").begin_array();
  const int I = all.expert_intermediate, H = shape_.hidden_size;
  const int sm_target = s_.on_gpu() ? gemm_sm_target(s_) : 0;
  for (const MicroBatchResult& r : all.micro_batch) {
    j.begin_object();
    j.field("tokens_per_rank", r.tokens).field("micro_batch_tokens_per_rank", r.tokens / 2);
    j.key("micro_batches").begin_array();
    for (int i = 0; i < 2; ++i) {
      j.begin_object();
      write_remote_bytes(j, r.traffic[i]);
      j.field("m_max", r.m[i]);
      write_gemm_json(j, "up", GemmShape{int(r.m[i]), 2 * I, H}, sm_target, -1);
      write_gemm_json(j, "down", GemmShape{int(r.m[i]), H, I}, sm_target, -1);
      j.end_object();
    }
    j.end_array();
    write_phase_json(j, "step", r.step, -1, -1);
    write_phase_json(j, "fused_sequence", r.fused, -1, -1);
    write_phase_json(j, "comm", r.comm, -1, -1);
    write_phase_json(j, "compute", r.compute, -1, -1);
    j.field("step_over_max_comm_compute", ratio(r.step.step.avg, max_comm_compute(r)));
    j.field("step_over_fused_sequence", ratio(r.step.step.avg, r.fused.step.avg));
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_combine", r.wrong_combine);
    j.field("wrong_step", r.wrong_step).field("launches_queued_ahead", !r.gate_expired);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

void BenchReport::write_no_sm_held_json(JsonWriter& j, const BenchResults& all) const {
  j.key("no_sm_held").begin_object();
  if (!all.no_sm_held_skipped.empty()) j.field("skipped", all.no_sm_held_skipped);
  j.field("graph", graph_).field("target_speed", 0.97);
  j.key("results").begin_array();
  for (const NoSmHeldResult& r : all.no_sm_held) {
    j.begin_object();
    j.field("tokens_per_rank", r.tokens);
    write_remote_bytes(j, r.traffic);
    write_gemm_json(j, "gemm", r.gemm, 0, r.gemm_alone.step.avg);
    j.field("delay_us", r.delay_us);
    write_phase_json(j, "gemm_alone", r.gemm_alone, -1, -1);
    write_phase_json(j, "gemm_in_dispatch", r.gemm_in_dispatch, -1, -1);
    write_phase_json(j, "gemm_in_combine", r.gemm_in_combine, -1, -1);
    j.field("dispatch_speed", ratio(r.gemm_alone.step.avg, r.gemm_in_dispatch.step.avg));
    j.field("combine_speed", ratio(r.gemm_alone.step.avg, r.gemm_in_combine.step.avg));
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_combine", r.wrong_combine);
    j.field("launches_queued_ahead", !r.gate_expired);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

}  // namespace moe_ep_tool
