#include "bench_report.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "dtypes.hpp"
#include "ep_calls.hpp"
#include "json_writer.hpp"
#include "nccl_baseline.hpp"

namespace moe_ep_tool {

namespace {

// What create allocates per rank, next to the documented bound (docs/semantics.md):
// 2 * ep_size * max_tokens_per_rank * row bytes + 64 MiB.
struct Workspace {
  uint64_t bytes = 0, bound = 0;
  moe_ep_status_t status = MOE_EP_SUCCESS;
};

Workspace workspace_of(const Session& s, const WorkloadSpec& w, bool zero_copy_combine) {
  Workspace ws;
  const moe_ep_params_t params = w.params();
  const moe_ep_config_t config = with_zero_copy_combine(s.config(), zero_copy_combine);  // as the runner creates
  ws.status = moe_ep_workspace_size(&params, &config, s.world().size, &ws.bytes);
  ws.bound = 2ull * w.world * uint64_t(w.max_tokens_per_rank) * (w.hidden_row_bytes() + w.scale_row_bytes()) +
             (64ull << 20);
  return ws;
}

// The library's MOE_EP_* environment variables in this process (they change
// what is measured: kernels, schedules), as (name, value) pairs.
std::vector<std::pair<std::string, std::string>> library_environment() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (entry.rfind("MOE_EP_", 0) == 0 && eq != std::string::npos)
      out.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string wrong_text(int64_t wrong) { return wrong < 0 ? "N/A" : std::to_string(wrong); }

void print_phase(double bytes_remote, double bytes_alg, const PhaseTiming& t, int64_t wrong) {
  std::printf(" %11.0f %8.2f %8.2f %8.2f %8.2f %8.2f %7.1f %7.1f %6s", bytes_remote, t.step.avg, t.step.p50, t.step.p99,
              t.rank_min, t.rank_max, gbps(bytes_alg, t.step.avg), gbps(bytes_remote, t.step.avg),
              wrong_text(wrong).c_str());
}

}  // namespace

double gbps(double bytes, double us) { return us > 0 ? bytes / us / 1e3 : 0; }  // bytes/us = MB/s

void write_phase_json(JsonWriter& j, const std::string& name, const PhaseTiming& t, double remote_bytes,
                      double alg_bytes) {
  j.key(name).begin_object();
  j.field("avg_us", t.step.avg).field("p50_us", t.step.p50).field("p99_us", t.step.p99);
  j.field("min_us", t.step.min).field("max_us", t.step.max);
  j.field("rank_min_avg_us", t.rank_min).field("rank_min", t.rank_argmin);
  j.field("rank_max_avg_us", t.rank_max).field("rank_max", t.rank_argmax);
  j.field("rank_max_p50_us", t.rank_max_p50);
  j.key("rank_avg_us").values(t.rank_avg);
  if (remote_bytes >= 0) j.field("busbw_GBps", gbps(remote_bytes, t.step.avg));
  if (alg_bytes >= 0) j.field("algbw_GBps", gbps(alg_bytes, t.step.avg));
  j.end_object();
}

BenchReport::BenchReport(const Session& s, const BenchOptions& o, const WorkloadSpec& shape, bool graph)
    : s_(s), o_(o), shape_(shape), graph_(graph) {}

void BenchReport::set_baselines(bool ceiling, bool nccl) {
  ceiling_ = ceiling;
  nccl_ = nccl;
}

std::vector<std::string> BenchReport::formulas() const {
  return traffic_formulas(s_.link().short_name, s_.link().crossing);
}

std::string BenchReport::mode() const {
  std::string m = graph_ ? "CUDA-graph replay" : "eager calls";
  if (s_.on_gpu()) m += o_.launch_gate ? ", launches queued ahead" : ", host-driven (launch cost included)";
  if (o_.zero_copy_combine) m += ", zero-copy combine input";
  return m;
}

void BenchReport::print_header() {
  const std::vector<std::string> lines = s_.rank_lines();
  if (!s_.world().is_root()) return;
  const WorkloadSpec& w = shape_;
  // NCCL is named only where this run can use it (a GPU backend's baseline).
  std::printf("# moe_ep_conformance bench: %s, backend %s, %d ranks%s\n", Session::version_line().c_str(),
              s_.backend_label().c_str(), s_.world().size,
              s_.on_gpu() ? (", NCCL " + NcclBaseline::version()).c_str() : "");
  if (!s_.on_gpu()) {
    std::printf(
        "# HOST backend: a reference that copies through the bootstrap; its timings are not performance "
        "figures\n");
  }
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::printf("# shape: hidden %d, payload %s x%d + %s, combine %s; top-%d of %d experts; routing %s", w.hidden_size,
              dtype_name(w.hidden_dtype).c_str(), w.row_elems(),
              w.scale_row_elems ? (dtype_name(w.scale_dtype) + " x" + std::to_string(w.scale_row_elems) + " scales").c_str()
                                : "no scales",
              dtype_name(w.combine_dtype).c_str(), w.top_k, w.num_experts, routing_name(w.routing.kind).c_str());
  if (w.routing.kind == RoutingKind::zipf) std::printf(" (s = %.2f)", w.routing.zipf_s);
  if (w.routing.mask_fraction > 0) std::printf(", %.0f%% picks masked", 100 * w.routing.mask_fraction);
  std::printf("\n# run: %s, num_sms %s, warmup %d, iters %d, max_tokens_per_rank %d (runtime max = tokens), seed %llu\n",
              mode().c_str(), o_.common.num_sms ? std::to_string(o_.common.num_sms).c_str() : "auto", o_.warmup,
              o_.iters, w.max_tokens_per_rank, static_cast<unsigned long long>(o_.common.seed));
  std::string environment;
  for (const auto& [name, value] : library_environment()) environment += " " + name + "=" + value;
  std::printf("# environment:%s\n", environment.empty() ? " no MOE_EP_* variables set" : environment.c_str());
  std::printf("# row bytes: B_dispatch %llu, B_combine %llu\n",
              static_cast<unsigned long long>(w.hidden_row_bytes() + w.scale_row_bytes()),
              static_cast<unsigned long long>(w.combine_row_bytes()));
  const Workspace ws = workspace_of(s_, w, o_.zero_copy_combine);
  if (ws.status == MOE_EP_SUCCESS) {
    std::printf(
        "# workspace per rank: %.1f MiB (moe_ep_workspace_size); documented bound 2*ep*max_tokens*B_dispatch + 64 MiB "
        "= "
        "%.1f MiB\n",
        double(ws.bytes) / (1 << 20), double(ws.bound) / (1 << 20));
  } else {
    std::printf("# workspace per rank: moe_ep_workspace_size returned %s\n", moe_ep_status_string(ws.status));
  }
  for (const std::string& f : formulas()) std::printf("#   %s\n", f.c_str());
  std::printf("#   %s\n", !s_.on_gpu()     ? "host time: steady clock around each call, barrier before each iteration"
                          : o_.launch_gate ? "GPU time: CUDA events around each call, launches queued ahead of the GPU"
                                           : "CUDA events around each call, launched as the host goes (host cost included)");
  std::printf("#   avg/p50/p99 over iterations; rmin/rmax = min/max over ranks of each rank's own avg\n#\n");
  std::fflush(stdout);
}

void BenchReport::print_sweep_columns() const {
  if (!s_.world().is_root()) return;
  std::printf("# %7s |%s |%s\n", "", "                                  dispatch                                      ",
              "                                  combine");
  const std::string bytes_column = std::string(s_.link().short_name) + "_bytes";
  std::printf("# %7s |%12s %8s %8s %8s %8s %8s %7s %7s %6s |%12s %8s %8s %8s %8s %8s %7s %7s %6s | %s\n", "tokens",
              bytes_column.c_str(), "avg", "p50", "p99", "rmin", "rmax", "algbw", "busbw", "#wrong",
              bytes_column.c_str(), "avg", "p50", "p99", "rmin", "rmax", "algbw", "busbw", "#wrong", "path");
  std::printf("# %7s |%12s %8s %8s %8s %8s %8s %7s %7s %6s |%12s %8s %8s %8s %8s %8s %7s %7s %6s | %s\n", "/rank",
              "(B)", "(us)", "(us)", "(us)", "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(B)", "(us)", "(us)", "(us)",
              "(us)", "(us)", "(GB/s)", "(GB/s)", "", "(rank 0: dispatch, combine)");
  std::fflush(stdout);
}

void BenchReport::print_row(const SizeResult& r) const {
  if (!s_.world().is_root()) return;
  const Traffic& t = r.traffic;
  std::printf("  %7d |", r.tokens);
  print_phase(t.mean_remote_bytes(t.dispatch_row_bytes), t.mean_alg_bytes(t.dispatch_row_bytes), r.dispatch,
              r.wrong_dispatch);
  std::printf(" |");
  print_phase(t.mean_remote_bytes(t.combine_row_bytes), t.mean_alg_bytes(t.combine_row_bytes), r.combine,
              r.wrong_combine);
  std::printf(" | %s, %s", moe_ep_path_name(r.dispatch_path), moe_ep_path_name(r.combine_path));
  std::printf("%s\n", r.gate_expired ? "  (launches could not be queued ahead: host-bound times)" : "");
  std::fflush(stdout);
}

void BenchReport::print_baselines(const std::vector<SizeResult>& results) const {
  if (!s_.world().is_root()) return;
  if (!ceiling_ && !nccl_) {
    std::printf("#\n# baselines: none (%s)\n", !s_.on_gpu()          ? (s_.backend_name() + " backend").c_str()
                                               : s_.world().size < 2 ? "one rank: nothing leaves the GPU"
                                                                     : "--no-baselines or no NCCL");
    return;
  }
  std::printf("#\n# baselines, same routing and bytes, same run; ratio = baseline time / moe_ep time (> 1: moe_ep faster)\n");
  std::printf("#   ceiling: every rank copies its rows(s->d)*B to each peer at once, copy engines, cudaIpc buffers\n");
  std::printf("#   nccl: dispatch = count exchange + D2H of counts (host round trip not timed) + grouped send/recv of\n"
              "#         packed rows; combine = grouped send/recv back; no packing, no reduction (a lower bound)\n");
  std::printf("# %7s | %-37s | %-46s | %-33s\n", "", "ceiling (copy engines, both directions)",
              "nccl (counts + grouped send/recv)", "moe_ep vs baselines");
  std::printf("# %7s | %8s %8s %8s %8s | %8s %8s %8s %8s %8s | %7s %7s %7s %7s\n", "tokens", "disp_us", "busbw",
              "comb_us", "busbw", "disp_us", "counts", "payload", "comb_us", "busbw", "disp/C", "comb/C", "nccl/d",
              "nccl/c");
  for (const SizeResult& r : results) {
    const Traffic& t = r.traffic;
    const double dn = t.mean_remote_bytes(t.dispatch_row_bytes), cn = t.mean_remote_bytes(t.combine_row_bytes);
    std::printf("  %7d |", r.tokens);
    if (r.has_ceiling) {
      std::printf(" %8.2f %8.1f %8.2f %8.1f |", r.ceiling_dispatch.step.avg, gbps(dn, r.ceiling_dispatch.step.avg),
                  r.ceiling_combine.step.avg, gbps(cn, r.ceiling_combine.step.avg));
    } else {
      std::printf(" %8s %8s %8s %8s |", "-", "-", "-", "-");
    }
    if (r.has_nccl) {
      std::printf(" %8.2f %8.2f %8.2f %8.2f %8.1f |", r.nccl_dispatch.step.avg, r.nccl_counts.step.avg,
                  r.nccl_payload.step.avg, r.nccl_combine.step.avg, gbps(cn, r.nccl_combine.step.avg));
    } else {
      std::printf(" %8s %8s %8s %8s %8s |", "-", "-", "-", "-", "-");
    }
    auto ratio = [](bool have, double base, double mine) { return have && mine > 0 ? base / mine : 0.0; };
    std::printf(" %7.2f %7.2f %7.2f %7.2f\n", ratio(r.has_ceiling, r.ceiling_dispatch.step.avg, r.dispatch.step.avg),
                ratio(r.has_ceiling, r.ceiling_combine.step.avg, r.combine.step.avg),
                ratio(r.has_nccl, r.nccl_dispatch.step.avg, r.dispatch.step.avg),
                ratio(r.has_nccl, r.nccl_combine.step.avg, r.combine.step.avg));
  }
  std::fflush(stdout);
}

void BenchReport::print_note(const std::string& line) const {
  if (!s_.world().is_root()) return;
  std::printf("# %s\n", line.c_str());
  std::fflush(stdout);
}

void BenchReport::print_layout_heading(const WorkloadSpec& w, const std::string& layout,
                                       const std::string& sizing) const {
  if (!s_.world().is_root()) return;
  std::printf("#\n# layout %s", layout.c_str());
  if (w.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    std::printf(": capacity %d rows per expert (%s)", w.capacity(), sizing.c_str());
  }
  if (w.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) {
    std::printf(": alignment %d, %lld rows (%s)", w.alignment(), static_cast<long long>(w.packed_rows()),
                sizing.c_str());
  }
  if (layout == "rank_major+user") {
    std::printf(
        ": RANK_MAJOR, then the reference permute and un-permute + weighted reduce (alignment %d); "
        "dispatch + permute + unpermute + combine in the d+c column of the summary",
        o_.expert_alignment ? o_.expert_alignment : 1);
  }
  std::printf("\n");
  const Workspace ws = workspace_of(s_, w, o_.zero_copy_combine);
  WorkloadSpec rank_major = w;
  rank_major.receive_layout = MOE_EP_LAYOUT_RANK_MAJOR;
  rank_major.expert_alignment = rank_major.expert_capacity = rank_major.expert_rows = 0;
  const Workspace base = workspace_of(s_, rank_major, o_.zero_copy_combine);
  if (ws.status == MOE_EP_SUCCESS && base.status == MOE_EP_SUCCESS && w.expert_layout()) {
    const uint64_t row = w.hidden_row_bytes() + w.scale_row_bytes();
    const double extra_rows = (double(ws.bytes) - double(base.bytes)) / double(row);
    std::printf("# workspace per rank: %.1f MiB, RANK_MAJOR %.1f MiB: %+.0f rows of B_dispatch (E_local x 128 = %d)\n",
                double(ws.bytes) / (1 << 20), double(base.bytes) / (1 << 20), extra_rows, w.experts_per_rank() * 128);
  } else if (w.expert_layout()) {
    std::printf("# workspace per rank: moe_ep_workspace_size returned %s (RANK_MAJOR: %s)\n",
                moe_ep_status_string(ws.status), moe_ep_status_string(base.status));
  }
  std::fflush(stdout);
}

void BenchReport::print_layouts(const std::vector<SizeResult>& results) const {
  if (!s_.world().is_root()) return;
  const char* names[] = {"rank_major", "expert_major", "expert_packed", "rank_major+user"};
  std::vector<int> sizes;
  for (const SizeResult& r : results) {
    if (std::find(sizes.begin(), sizes.end(), r.tokens) == sizes.end()) sizes.push_back(r.tokens);
  }
  auto find = [&](int tokens, const std::string& layout) -> const SizeResult* {
    for (const SizeResult& r : results) {
      if (r.tokens == tokens && r.layout == layout) return &r;
    }
    return nullptr;
  };
  std::printf(
      "#\n# layouts side by side: d+c = dispatch + combine per iteration, avg over iterations (us);\n"
      "#   rank_major+user adds the reference permute and un-permute/reduce between them (their own times "
      "after it)\n");
  std::printf("# %7s | %10s %10s %10s %10s %8s %8s | %8s %8s %8s\n", "tokens", "rank_d+c", "emajor_d+c", "epacked_d+c",
              "user_d+c", "permute", "unperm", "EP/RM", "EP/user", "EP-RM");
  for (int t : sizes) {
    const SizeResult* r[4];
    for (int i = 0; i < 4; ++i) r[i] = find(t, names[i]);
    std::printf("  %7d |", t);
    for (int i = 0; i < 4; ++i) {
      if (r[i]) {
        std::printf(" %10.2f", r[i]->pair.step.avg);
      } else {
        std::printf(" %10s", "-");
      }
    }
    if (r[3] && r[3]->has_user) {
      std::printf(" %8.2f %8.2f |", r[3]->permute.step.avg, r[3]->unpermute.step.avg);
    } else {
      std::printf(" %8s %8s |", "-", "-");
    }
    auto ratio = [](const SizeResult* a, const SizeResult* b) {
      return a && b && b->pair.step.avg > 0 ? a->pair.step.avg / b->pair.step.avg : 0.0;
    };
    std::printf(" %8.3f %8.3f", ratio(r[2], r[0]), ratio(r[2], r[3]));
    if (r[2] && r[0]) {
      std::printf(" %8.2f\n", r[2]->pair.step.avg - r[0]->pair.step.avg);
    } else {
      std::printf(" %8s\n", "-");
    }
  }
  std::printf(
      "#   EP/RM = expert_packed / rank_major, EP/user = expert_packed / rank_major+user, EP-RM in us "
      "(0.000 or -: a layout missing)\n");
  std::fflush(stdout);
}

void BenchReport::print_wire_heading(const WorkloadSpec& w, const std::string& wire) const {
  if (!s_.world().is_root()) return;
  const char* scale = w.wire_scale == MOE_EP_WIRE_SCALE_UE8M0 ? "UE8M0" : "FP32";
  std::printf("#\n# wire %s: ", wire.c_str());
  if (wire == "quantize+as_is") {
    std::printf(
        "the reference quantize kernel (%s rows -> e4m3fn + fp32 scale per 128 elements, FP32 or UE8M0 as "
        "--wire-scale) into the rows dispatch reads, then an AS_IS dispatch of %s x%d + fp32 x%d; the dispatch "
        "columns time the dispatch alone, the summary adds the kernel\n",
        o_.dtype.c_str(), dtype_name(w.hidden_dtype).c_str(), w.row_elems(), w.scale_row_elems);
  } else if (wire == "as_is") {
    std::printf("dispatch_wire and combine_wire AS_IS (rows move as they are)\n");
  } else {
    std::printf("dispatch_wire FP8_E4M3_BLOCK128 (%s scales%s), combine_wire %s\n", scale,
                w.dispatch_dequantize ? ", dispatch_dequantize: rows arrive dequantized" : "",
                w.fp8_combine() ? "FP8_E4M3_BLOCK128" : "AS_IS");
  }
  const uint64_t d = w.fp8_dispatch() ? fp8_wire_row_bytes(w.row_elems()) : w.hidden_row_bytes() + w.scale_row_bytes();
  const uint64_t c = w.fp8_combine() ? fp8_wire_row_bytes(w.hidden_size) : w.combine_row_bytes();
  std::printf("# bytes that cross per row: B_dispatch %llu, B_combine %llu\n", static_cast<unsigned long long>(d),
              static_cast<unsigned long long>(c));
  std::fflush(stdout);
}

void BenchReport::print_wires(const std::vector<SizeResult>& results) const {
  if (!s_.world().is_root()) return;
  std::vector<int> sizes;
  for (const SizeResult& r : results) {
    if (std::find(sizes.begin(), sizes.end(), r.tokens) == sizes.end()) sizes.push_back(r.tokens);
  }
  auto find = [&](int tokens, const std::string& wire) -> const SizeResult* {
    for (const SizeResult& r : results) {
      if (r.tokens == tokens && r.wire == wire) return &r;
    }
    return nullptr;
  };
  std::printf(
      "#\n# wires side by side: avg over iterations (us); fp8 dispatch = the fp8 wire's, or fp8_dispatch's where "
      "fp8 was skipped;\n#   q+disp = the reference quantize kernel + the AS_IS dispatch of its FP8 rows\n");
  std::printf("# %7s | %9s %9s %9s %9s %9s %9s %9s | %7s %7s %8s %8s %7s\n", "tokens", "as_is_d", "as_is_c", "fp8_d",
              "fp8_c", "quantize", "q+disp", "fp8d_d", "D/as_is", "C/as_is", "D-as_is", "C-as_is", "fp8/sep");
  auto cell = [](const SizeResult* r, const PhaseTiming SizeResult::*phase) {
    if (r) {
      std::printf(" %9.2f", (r->*phase).step.avg);
    } else {
      std::printf(" %9s", "-");
    }
  };
  for (int t : sizes) {
    const SizeResult* as_is = find(t, "as_is");
    const SizeResult* fp8 = find(t, "fp8");
    const SizeResult* fp8d = find(t, "fp8_dispatch");
    const SizeResult* sep = find(t, "quantize+as_is");
    const SizeResult* in_kernel = fp8 ? fp8 : fp8d;  // the in-kernel quantizing dispatch
    std::printf("  %7d |", t);
    cell(as_is, &SizeResult::dispatch);
    cell(as_is, &SizeResult::combine);
    cell(fp8, &SizeResult::dispatch);
    cell(fp8, &SizeResult::combine);
    cell(sep, &SizeResult::quantize);
    cell(sep, &SizeResult::quantize_dispatch);
    cell(fp8d, &SizeResult::dispatch);
    std::printf(" |");
    auto ratio = [](double a, double b) {
      if (b > 0) {
        std::printf(" %7.3f", a / b);
      } else {
        std::printf(" %7s", "-");
      }
    };
    auto diff = [](bool have, double a, double b) {
      if (have) {
        std::printf(" %+8.2f", a - b);
      } else {
        std::printf(" %8s", "-");
      }
    };
    const bool d = in_kernel && as_is, c = fp8 && as_is;
    ratio(d ? in_kernel->dispatch.step.avg : 0, d ? as_is->dispatch.step.avg : 0);
    ratio(c ? fp8->combine.step.avg : 0, c ? as_is->combine.step.avg : 0);
    diff(d, d ? in_kernel->dispatch.step.avg : 0, d ? as_is->dispatch.step.avg : 0);
    diff(c, c ? fp8->combine.step.avg : 0, c ? as_is->combine.step.avg : 0);
    const bool q = in_kernel && sep && sep->has_quantize;
    ratio(q ? in_kernel->dispatch.step.avg : 0, q ? sep->quantize_dispatch.step.avg : 0);
    std::printf("\n");
  }
  std::printf(
      "#   D/as_is, C/as_is: fp8 dispatch and combine time over AS_IS's; D-as_is, C-as_is: the same as differences "
      "(us);\n#   fp8/sep: in-kernel quantizing dispatch over q+disp (-: a wire missing)\n");
  std::printf(
      "#   targets (DeepSeek shape, bf16 rows, 2 GPUs): D/as_is <= 0.60 and C/as_is <= 0.65 at 4096 tokens, "
      "D-as_is and C-as_is <= +1 us at 128 tokens, fp8/sep <= 0.85 at 4096 tokens\n");
  std::fflush(stdout);
}

bool BenchReport::print_footer(const BenchResults& all) const {
  int64_t wrong = 0;
  double dispatch_bw = 0, combine_bw = 0;
  bool checked = false;
  auto count = [&](int64_t w) {  // -1: not checked
    checked = checked || w >= 0;
    wrong += std::max<int64_t>(w, 0);
  };
  for (const SizeResult& r : all.sweep) {
    count(r.wrong_dispatch);
    count(r.wrong_combine);
    wrong += r.nccl_wrong_counts;
    dispatch_bw += gbps(r.traffic.mean_remote_bytes(r.traffic.dispatch_row_bytes), r.dispatch.step.avg);
    combine_bw += gbps(r.traffic.mean_remote_bytes(r.traffic.combine_row_bytes), r.combine.step.avg);
  }
  for (const DecodeStepResult& r : all.decode_step) {
    count(r.wrong_dispatch);
    count(r.wrong_parts);
    count(r.wrong_step);
  }
  for (const DecodeStepResult& r : all.decode_step) count(r.wrong_split_step);
  for (const OverlapResult& r : all.overlap) {
    count(r.wrong_dispatch);
    count(r.wrong_combine);
  }
  for (const MicroBatchResult& r : all.micro_batch) {
    count(r.wrong_dispatch);
    count(r.wrong_combine);
    count(r.wrong_step);
  }
  for (const NoSmHeldResult& r : all.no_sm_held) {
    count(r.wrong_dispatch);
    count(r.wrong_combine);
  }
  if (s_.world().is_root()) {
    std::printf("#\n# Wrong elements : %lld %s\n", static_cast<long long>(wrong),
                !checked ? "(not checked: -c 0)"
                : wrong  ? "FAILED"
                         : "OK");
    if (!all.sweep.empty()) {
      std::printf("# Avg bus bandwidth    : dispatch %.2f GB/s, combine %.2f GB/s\n", dispatch_bw / all.sweep.size(),
                  combine_bw / all.sweep.size());
    }
    std::printf("#\n");
    std::fflush(stdout);
  }
  return wrong == 0;
}

void BenchReport::write_json(const BenchResults& all, const std::string& path) const {
  const std::vector<SizeResult>& results = all.sweep;
  JsonWriter j;
  j.begin_object();
  j.field("tool", "moe_ep_conformance bench").field("format", 2);
  write_machine(j, s_);  // collective
  if (!s_.world().is_root()) return;
  const WorkloadSpec& w = shape_;
  j.key("config").begin_object();
  j.field("backend", s_.backend_label()).field("ranks", s_.world().size).field("mode", mode());
  j.field("graph", graph_)
      .field("zero_copy_combine", o_.zero_copy_combine)
      .field("decode_step", o_.decode_step)
      .field("overlap_gemm", o_.overlap_gemm)
      .field("micro_batch_overlap", o_.micro_batch_overlap)
      .field("no_sm_held", o_.no_sm_held)
      .field("layout", o_.layout)
      .field("wire", o_.wire)
      .field("wire_scale", o_.wire_scale)
      .field("dispatch_dequantize", o_.dispatch_dequantize)
      .field("expert_alignment", o_.expert_alignment)
      .field("expert_capacity", all.expert_capacity)
      .field("expert_packed_rows", all.expert_packed_rows)
      .field("expert_capacity_auto", o_.expert_capacity == kExpertRowsAuto)
      .field("expert_packed_rows_auto", o_.expert_packed_rows == kExpertRowsAuto)
      .field("expert_gemm", o_.expert_gemm)
      .field("launch_gate", o_.launch_gate)
      .field("num_sms", o_.common.num_sms)
      .field("warmup", o_.warmup)
      .field("iters", o_.iters);
  j.field("hidden", w.hidden_size).field("payload_dtype", dtype_name(w.hidden_dtype)).field("row_elems", w.row_elems());
  j.field("scale_row_elems", w.scale_row_elems).field("scale_dtype", dtype_name(w.scale_dtype));
  j.field("combine_dtype", dtype_name(w.combine_dtype)).field("top_k", w.top_k).field("experts", w.num_experts);
  j.field("routing", routing_name(w.routing.kind)).field("zipf_s", w.routing.zipf_s);
  j.field("mask_fraction", w.routing.mask_fraction).field("max_tokens_per_rank", w.max_tokens_per_rank);
  j.field("seed", int64_t(o_.common.seed)).field("timing", s_.on_gpu() ? "cuda events" : "host steady clock");
  j.field("remote_bytes", std::string("bytes that ") + s_.link().crossing);
  j.key("environment").begin_object();
  for (const auto& [name, value] : library_environment()) j.field(name, value);
  j.end_object();
  j.field("dispatch_row_bytes", int64_t(w.hidden_row_bytes() + w.scale_row_bytes()));
  j.field("combine_row_bytes", int64_t(w.combine_row_bytes()));
  const Workspace ws = workspace_of(s_, w, o_.zero_copy_combine);
  if (ws.status == MOE_EP_SUCCESS) j.field("workspace_bytes", int64_t(ws.bytes));
  j.field("workspace_bound_bytes", int64_t(ws.bound));
  j.end_object();
  j.key("formulas").values(formulas());
  j.key("results").begin_array();
  for (const SizeResult& r : results) {
    const Traffic& t = r.traffic;
    const double dn = t.mean_remote_bytes(t.dispatch_row_bytes), da = t.mean_alg_bytes(t.dispatch_row_bytes);
    const double cn = t.mean_remote_bytes(t.combine_row_bytes), ca = t.mean_alg_bytes(t.combine_row_bytes);
    j.begin_object();
    j.field("tokens_per_rank", r.tokens);
    j.field("layout", r.layout);
    j.field("wire", r.wire);
    j.key("bytes").begin_object();
    j.field("dispatch_remote", dn)
        .field("dispatch_alg", da)
        .field("dispatch_sel", t.mean_sel_bytes(t.dispatch_row_bytes));
    j.field("combine_remote", cn).field("combine_alg", ca).field("combine_sel", t.mean_sel_bytes(t.combine_row_bytes));
    j.field("dispatch_row", int64_t(t.dispatch_row_bytes)).field("combine_row", int64_t(t.combine_row_bytes));
    j.key("rows").values(t.rows).key("valid_picks").values(t.picks);
    j.end_object();
    j.key("moe_ep").begin_object();
    write_phase_json(j, "dispatch", r.dispatch, dn, da);
    write_phase_json(j, "combine", r.combine, cn, ca);
    write_phase_json(j, "dispatch_plus_combine", r.pair, -1, -1);  // with the reference kernels in rank_major+user
    if (r.has_user) {
      write_phase_json(j, "user_permute", r.permute, -1, -1);
      write_phase_json(j, "user_unpermute", r.unpermute, -1, -1);
    }
    if (r.has_quantize) {  // quantize+as_is: the reference quantize kernel, and it + the dispatch
      write_phase_json(j, "reference_quantize", r.quantize, -1, -1);
      write_phase_json(j, "quantize_plus_dispatch", r.quantize_dispatch, -1, -1);
    }
    j.field("wrong_dispatch", r.wrong_dispatch).field("wrong_combine", r.wrong_combine);
    j.field("launches_queued_ahead", !r.gate_expired);
    j.field("dispatch_path", std::string(moe_ep_path_name(r.dispatch_path)));
    j.field("combine_path", std::string(moe_ep_path_name(r.combine_path)));
    j.end_object();
    if (r.has_ceiling) {
      j.key("ceiling").begin_object();
      write_phase_json(j, "dispatch", r.ceiling_dispatch, dn, -1);
      write_phase_json(j, "combine", r.ceiling_combine, cn, -1);
      j.end_object();
    }
    if (r.has_nccl) {
      j.key("nccl").begin_object();
      write_phase_json(j, "dispatch", r.nccl_dispatch, dn, da);
      write_phase_json(j, "dispatch_counts", r.nccl_counts, -1, -1);
      write_phase_json(j, "dispatch_payload", r.nccl_payload, dn, da);
      write_phase_json(j, "combine", r.nccl_combine, cn, ca);
      j.field("wrong_counts", r.nccl_wrong_counts);
      j.end_object();
    }
    j.end_object();
  }
  j.end_array();
  if (!all.layouts_skipped.empty()) {
    j.key("layouts_skipped").begin_object();
    for (const auto& [layout, why] : all.layouts_skipped) j.field(layout, why);
    j.end_object();
  }
  if (!all.wires_skipped.empty()) {
    j.key("wires_skipped").begin_object();
    for (const auto& [wire, why] : all.wires_skipped) j.field(wire, why);
    j.end_object();
  }
  if (o_.decode_step) write_decode_step_json(j, all);
  if (o_.overlap_gemm) write_overlap_json(j, all);
  if (o_.micro_batch_overlap) write_micro_batch_json(j, all);
  if (o_.no_sm_held) write_no_sm_held_json(j, all);
  j.end_object();
  j.save(path);
  std::printf("# wrote %s\n", path.c_str());
}

}  // namespace moe_ep_tool
