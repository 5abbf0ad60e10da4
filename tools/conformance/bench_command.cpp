#include "bench_command.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <utility>

#include "bench_report.hpp"
#include "check.hpp"
#include "counter_rng.hpp"
#include "dtypes.hpp"
#include "ep_calls.hpp"
#include "errors.hpp"
#include "graph_capture.hpp"
#include "grouped_expert.hpp"
#include "moe_ep_runner.hpp"
#include "nccl_baseline.hpp"
#include "peer_copy_ceiling.hpp"
#include "reference_quantize.hpp"
#include "stand_in_expert.hpp"
#include "user_permute.hpp"

namespace moe_ep_tool {

std::vector<int> bench_sizes(const BenchOptions& o) {
  if (!o.token_list.empty()) return o.token_list;
  std::vector<int> sizes;
  for (int64_t t = o.min_tokens; t <= o.max_tokens; t *= o.step_factor) sizes.push_back(int(t));
  return sizes;
}

std::vector<int> decode_step_sizes(const BenchOptions& o) {
  return o.sizes_given ? bench_sizes(o) : std::vector<int>{1, 8, 32, 128};
}

std::vector<int> overlap_sizes(const BenchOptions& o) {
  return o.sizes_given ? bench_sizes(o) : std::vector<int>{4096};
}

std::vector<int> micro_batch_sizes(const BenchOptions& o) {
  return o.sizes_given ? bench_sizes(o) : std::vector<int>{256, 4096};
}

std::vector<int> no_sm_held_sizes(const BenchOptions& o) {
  return o.sizes_given ? bench_sizes(o) : std::vector<int>{128, 4096};
}

std::vector<std::string> bench_layouts(const std::string& layout) {
  if (layout == "all") return {"rank_major", "expert_major", "expert_packed", "rank_major+user"};
  return {layout};
}

std::vector<std::string> bench_wires(const std::string& wire) {
  if (wire == "all") return {"as_is", "fp8", "fp8_dispatch", "quantize+as_is"};
  return {wire};
}

namespace {
WorkloadSpec bench_spec(const BenchOptions& o, int world, int max_tokens, int tokens);
BenchOptions with_layout(const BenchOptions& o, const std::string& layout);
BenchOptions with_wire(const BenchOptions& o, const std::string& wire);
}  // namespace

ExpertRowsNeeded expert_rows_needed(const BenchOptions& o, int world, int tokens, int alignment) {
  const WorkloadSpec w = bench_spec(with_wire(with_layout(o, "rank_major"), "as_is"), world, tokens, tokens);
  const std::vector<RankRouting> all = make_all_routing(w);
  const int E = w.experts_per_rank();
  ExpertRowsNeeded n;
  std::vector<std::vector<int64_t>> rows(size_t(world), std::vector<int64_t>(size_t(E), 0));
  for (const RankRouting& source : all) {
    for (int32_t id : source.topk_ids) {
      const int dest = w.owner(id);  // -1: masked or out of range, received nowhere
      if (dest >= 0) ++rows[size_t(dest)][size_t(id - dest * E)];
    }
  }
  for (const std::vector<int64_t>& experts : rows) {
    int64_t packed = 0;
    for (int64_t count : experts) {
      n.per_expert = std::max(n.per_expert, count);
      packed += (count + alignment - 1) / alignment * alignment;
    }
    n.packed = std::max(n.packed, packed);
  }
  return n;
}

namespace {

int layout_code(const std::string& name) {
  if (name == "expert_major") return MOE_EP_LAYOUT_EXPERT_MAJOR;
  if (name == "expert_packed") return MOE_EP_LAYOUT_EXPERT_PACKED;
  if (name == "rank_major" || name == "rank_major+user") return MOE_EP_LAYOUT_RANK_MAJOR;
  fail("--layout must be rank_major, expert_major, expert_packed, rank_major+user or all, got '" + name + "'");
}

// o.wire (one wire) on the workload s: the FP8 wire's parameters, or for
// quantize+as_is the rows as the reference quantize kernel leaves them
// (e4m3fn, one fp32 scale per 128 elements) moved AS_IS, combine unchanged.
void apply_wire(const BenchOptions& o, WorkloadSpec& s) {
  if (o.wire == "as_is") return;
  if (o.wire != "fp8" && o.wire != "fp8_dispatch" && o.wire != "quantize+as_is") {
    fail("--wire must be as_is, fp8, fp8_dispatch, quantize+as_is or all, got '" + o.wire + "'");
  }
  if (o.dtype == "fp8") {
    fail("--wire " + o.wire + ": expected --dtype bf16, fp16 or fp32 (the rows the wire quantizes), got fp8");
  }
  if (o.wire == "quantize+as_is") {
    s.hidden_dtype = parse_dtype("fp8_e4m3");
    s.scale_row_elems = (s.row_elems() + 127) / 128;
    s.scale_dtype = parse_dtype("fp32");
    return;
  }
  s.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  s.wire_scale = parse_wire_scale(o.wire_scale);
  s.dispatch_dequantize = o.dispatch_dequantize;
  if (o.wire == "fp8") s.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
}

// quantize+as_is: the rows of workload w before the reference kernel
// quantizes them (--dtype rows, the FP8 dispatch wire's values and scale rule).
WorkloadSpec quantize_source(const BenchOptions& o, const WorkloadSpec& w) {
  WorkloadSpec s = w;
  s.hidden_dtype = parse_dtype(o.dtype);
  s.scale_row_elems = 0;
  s.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  s.wire_scale = parse_wire_scale(o.wire_scale);
  s.dispatch_dequantize = false;
  return s;
}

// o.layout and o.wire are one layout and one wire here (the sweep runs each of "all" with its own copy).
WorkloadSpec bench_spec(const BenchOptions& o, int world, int max_tokens, int tokens) {
  if (o.experts % world != 0) {
    fail("--experts " + std::to_string(o.experts) + " must be a multiple of the " + std::to_string(world) + " ranks");
  }
  if (o.top_k > o.experts) fail("--topk must be <= --experts");
  WorkloadSpec s;
  s.world = world;
  s.num_experts = o.experts;
  s.top_k = o.top_k;
  s.max_tokens_per_rank = max_tokens;
  s.runtime_max_tokens_per_rank = tokens;
  s.hidden_size = o.hidden;
  if (o.dtype == "fp8") {  // DeepSeek-style: e4m3 payload, one fp32 scale per 128 elements
    s.hidden_dtype = parse_dtype("fp8_e4m3");
    s.scale_row_elems = (o.hidden + 127) / 128;
    s.scale_dtype = parse_dtype("fp32");
    s.combine_dtype = parse_dtype("bf16");
  } else {
    s.hidden_dtype = parse_dtype(o.dtype);
    s.combine_dtype = s.hidden_dtype;
  }
  if (!o.combine_dtype.empty()) s.combine_dtype = parse_dtype(o.combine_dtype);
  s.routing.kind = parse_routing(o.routing);
  s.routing.zipf_s = o.zipf_s;
  s.routing.mask_fraction = o.mask_fraction;
  s.tokens.assign(world, tokens);
  s.seed = derive(o.common.seed, uint64_t(tokens));
  s.receive_layout = layout_code(o.layout);
  const bool major = s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR,
             packed = s.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED;
  if ((major && o.expert_capacity < 0) || (packed && o.expert_packed_rows < 0)) {
    fail("bench: --expert-capacity / --expert-packed-rows auto reached a handle unresolved (with_expert_rows)");
  }
  if (major) s.expert_capacity = o.expert_capacity;
  if (packed) {
    s.expert_alignment = o.expert_alignment;
    s.expert_rows = o.expert_packed_rows;
  }
  apply_wire(o, s);
  return s;
}

// The options of one layout of the sweep, or of the grouped-GEMM expert (EXPERT_PACKED).
BenchOptions with_layout(const BenchOptions& o, const std::string& layout) {
  BenchOptions one = o;
  one.layout = layout;
  return one;
}

BenchOptions with_wire(const BenchOptions& o, const std::string& wire) {
  BenchOptions one = o;
  one.wire = wire;
  return one;
}

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// o with --expert-capacity and --expert-packed-rows auto resolved for handles
// of `max_tokens` tokens per rank that measure `sizes`: what a server sizes
// from its routing, so that nothing is dropped and the result (and the
// workspace, and the check's work) stays near the pairs that arrive rather
// than the worst case (EXPERT_MAJOR's is world x max_tokens rows per expert:
// 14 GB at 4096 tokens in the DeepSeek shape).  EXPERT_MAJOR: the most rows
// any expert receives over the sizes, rounded up to --expert-alignment (128
// without one: the common GEMM tile), at most the worst case; EXPERT_PACKED:
// the most rows a rank fills with each expert's rows aligned (a multiple of
// the alignment, at most the worst case).  The routing of a size does not
// depend on the layout, so this is the routing the sweep then runs.
BenchOptions with_expert_rows(const BenchOptions& o, int world, const std::vector<int>& sizes, int max_tokens) {
  BenchOptions r = o;
  const bool capacity = o.expert_capacity == kExpertRowsAuto, packed = o.expert_packed_rows == kExpertRowsAuto;
  if (!capacity && !packed) return r;
  const int capacity_alignment = o.expert_alignment ? o.expert_alignment : 128;
  const int packed_alignment = o.expert_alignment ? o.expert_alignment : 1;
  ExpertRowsNeeded most;
  int most_at = 0, packed_at = 0;
  for (int tokens : sizes) {
    // Each layout's own rounding: the per-expert maximum does not depend on it.
    const ExpertRowsNeeded n = expert_rows_needed(o, world, tokens, packed_alignment);
    if (n.per_expert > most.per_expert || most_at == 0) {
      most.per_expert = n.per_expert;
      most_at = tokens;
    }
    if (n.packed > most.packed || packed_at == 0) {
      most.packed = n.packed;
      packed_at = tokens;
    }
  }
  const int64_t worst_per_expert = int64_t(world) * max_tokens;
  if (capacity) {
    r.expert_capacity =
        int(std::min(align_up(std::max<int64_t>(most.per_expert, 1), capacity_alignment), worst_per_expert));
    r.expert_capacity_note = "auto: the most rows an expert receives, " + std::to_string(most.per_expert) + " at " +
                             std::to_string(most_at) + " tokens, rounded up to " + std::to_string(capacity_alignment) +
                             (r.expert_capacity == worst_per_expert ? ", at most world x max tokens" : "") +
                             "; --expert-capacity 0: the worst case";
  } else {
    r.expert_capacity_note = o.expert_capacity ? "--expert-capacity" : "the worst case, world x max tokens";
  }
  if (packed) {
    r.expert_packed_rows = int(std::max<int64_t>(most.packed, packed_alignment));
    r.expert_packed_rows_note = "auto: the most rows a rank fills, each expert's rounded up to the alignment, at " +
                                std::to_string(packed_at) + " tokens; --expert-packed-rows 0: the worst case";
  } else {
    r.expert_packed_rows_note = o.expert_packed_rows ? "--expert-packed-rows" : "the worst case";
  }
  return r;
}

class Sweep {
 public:
  // sizes: what this run measures; baselines: the ceiling and NCCL, where
  // they can run (the plain sweep only).
  Sweep(const Session& s, const BenchOptions& o, std::vector<int> sizes, bool baselines)
      : s_(s), o_(o), sizes_(std::move(sizes)) {
    if (sizes_.empty()) fail("no sizes: -b must be <= -e");
    const int largest = *std::max_element(sizes_.begin(), sizes_.end());
    largest_ = bench_spec(o, s.world().size, largest, largest);
    graph_ = o.graph && s.on_gpu();
    loop_.warmup = o.warmup;
    loop_.iters = o.iters;
    loop_.gated = o.launch_gate;
    const uint64_t row = std::max(largest_.hidden_row_bytes() + largest_.scale_row_bytes(), largest_.combine_row_bytes());
    if (baselines && PeerCopyCeiling::available(s)) ceiling_ = std::make_unique<PeerCopyCeiling>(s, largest * row);
    if (baselines && s.on_gpu() && s.world().size > 1) {
      nccl_skipped_ = NcclBaseline::group_refusal(s);
      if (nccl_skipped_.empty()) nccl_ = std::make_unique<NcclBaseline>(s, largest, row);
    }
  }

  const WorkloadSpec& largest() const { return largest_; }
  bool graph() const { return graph_; }
  bool has_ceiling() const { return ceiling_ != nullptr; }
  bool has_nccl() const { return nccl_ != nullptr; }
  const std::string& nccl_skipped() const { return nccl_skipped_; }  // why the NCCL baseline is absent
  const std::vector<int>& sizes() const { return sizes_; }

  // user: rank_major+user's reference kernels; quantize: quantize+as_is's.
  SizeResult measure(MoeEpRunner& moe, int tokens, UserPermute* user = nullptr, ReferenceQuantize* quantize = nullptr) {
    SizeResult r;
    r.tokens = tokens;
    r.layout = o_.layout;
    r.wire = o_.wire;
    const WorkloadSpec w = bench_spec(o_, s_.world().size, largest_.max_tokens_per_rank, tokens);
    const std::vector<RankRouting> all = make_all_routing(w);
    r.traffic = measure_traffic(w, all);
    moe.load(w, all);
    if (o_.check) {
      auto [d, c] = moe.check(graph_);
      if (user) {  // the reference permute on this dispatch, counted as dispatch's
        const auto stream = static_cast<cudaStream_t>(s_.stream());
        moe.launch_dispatch(graph_, s_.stream());  // the result views the timed loop reads
        TOOL_CHECK_CUDA(user->permute(w, moe.dispatch_result(), stream));
        d += user->check_permute(w, moe.dispatch_result(), stream);
        moe.launch_combine(graph_, s_.stream());
      }
      r.wrong_dispatch = s_.world().sum(d);
      r.wrong_combine = s_.world().sum(c);
    }
    if (quantize) {  // the kernel's output, written where dispatch reads its rows, checked once
      const auto stream = static_cast<cudaStream_t>(s_.stream());
      quantize->load(quantize_source(o_, w), s_.world().rank, s_.stream());
      if (o_.check) {
        TOOL_CHECK_CUDA(quantize->quantize(moe.inputs().hidden(), moe.inputs().scales(), stream));
        r.wrong_dispatch += s_.world().sum(quantize->check(moe.inputs().hidden(), moe.inputs().scales(), stream));
      }
    }
    const LoopResult t = user       ? time_with_user(moe, *user, w)
                         : quantize ? time_with_quantize(moe, *quantize)
                                    : moe.time(loop_, graph_);
    moe.drop_graphs();
    const size_t first = quantize ? 1 : 0;      // dispatch: after the reference quantize with `quantize`
    const size_t last = t.phase_us.size() - 1;  // combine: after the reference kernels with `user`
    r.dispatch = reduce_phase(s_.world(), t.phase_us[first]);
    r.combine = reduce_phase(s_.world(), t.phase_us[last]);
    std::vector<double> pair = t.phase_us[0];
    for (size_t p = 1; p <= last; ++p) pair = sum_each(pair, t.phase_us[p]);
    r.pair = reduce_phase(s_.world(), pair);
    if (user) {
      r.has_user = true;
      r.permute = reduce_phase(s_.world(), t.phase_us[1]);
      r.unpermute = reduce_phase(s_.world(), t.phase_us[2]);
    }
    if (quantize) {
      r.has_quantize = true;
      r.quantize = reduce_phase(s_.world(), t.phase_us[0]);
      r.quantize_dispatch = reduce_phase(s_.world(), sum_each(t.phase_us[0], t.phase_us[1]));
    }
    r.gate_expired = t.gate_expired;
    moe_ep_get_last_path(moe.handle(), MOE_EP_PHASE_DISPATCH, &r.dispatch_path);
    moe_ep_get_last_path(moe.handle(), MOE_EP_PHASE_COMBINE, &r.combine_path);
    if (ceiling_) measure_ceiling(r);
    if (nccl_) measure_nccl(r);
    return r;
  }

  DecodeStepResult measure_decode_step(DecodeStep& step, int tokens) {
    const WorkloadSpec w = bench_spec(o_, s_.world().size, largest_.max_tokens_per_rank, tokens);
    WorkloadSpec fresh = w;  // the same size with other inputs, for the check of the whole step
    fresh.seed = derive(w.seed, 0x57e9);
    const std::vector<RankRouting> all = make_all_routing(w), fresh_all = make_all_routing(fresh);
    DecodeStepResult r = step.measure(w, all, fresh, fresh_all, o_.check != 0, loop_);
    r.traffic = measure_traffic(w, all);
    return r;
  }

  // One micro-batch's workload at step size `tokens`: half as many tokens per rank.
  WorkloadSpec micro_batch_spec(int tokens) const {
    return bench_spec(o_, s_.world().size, largest_.max_tokens_per_rank / 2, tokens / 2);
  }

  MicroBatchResult measure_micro_batch(MicroBatchOverlap& overlap, int tokens) {
    return overlap.measure(micro_batch_spec(tokens), o_.check != 0, loop_);
  }

  // --overlap-gemm and --no-sm-held: `mode`.measure on the runner loaded with this size.
  template <typename Mode>
  auto measure_loaded(MoeEpRunner& moe, Mode& mode, int tokens) {
    const WorkloadSpec w = bench_spec(o_, s_.world().size, largest_.max_tokens_per_rank, tokens);
    const std::vector<RankRouting> all = make_all_routing(w);
    moe.load(w, all);
    auto r = mode.measure(moe, graph_, o_.check != 0, loop_);
    r.traffic = measure_traffic(w, all);
    return r;
  }

 private:
  // rank_major+user: dispatch, permute, unpermute (the expert's place between
  // them is empty: the expert output is the reference's own buffer), combine.
  LoopResult time_with_user(MoeEpRunner& moe, UserPermute& user, const WorkloadSpec& w) {
    moe.prepare(graph_);
    const auto stream = static_cast<cudaStream_t>(s_.stream());
    return time_loop(s_, loop_, 4, [&](Marks& m) {
      m.mark();
      moe.launch_dispatch(graph_, s_.stream());
      m.mark();
      TOOL_CHECK_CUDA(user.permute(w, moe.dispatch_result(), stream));
      m.mark();
      TOOL_CHECK_CUDA(user.unpermute(w, moe.dispatch_result(), stream));
      m.mark();
      moe.launch_combine(graph_, s_.stream());
      m.mark();
    });
  }

  // quantize+as_is: the reference quantize kernel into the rows dispatch
  // reads, the AS_IS dispatch of them, combine.
  LoopResult time_with_quantize(MoeEpRunner& moe, const ReferenceQuantize& quantize) {
    moe.prepare(graph_);
    const auto stream = static_cast<cudaStream_t>(s_.stream());
    return time_loop(s_, loop_, 3, [&](Marks& m) {
      m.mark();
      TOOL_CHECK_CUDA(quantize.quantize(moe.inputs().hidden(), moe.inputs().scales(), stream));
      m.mark();
      moe.launch_dispatch(graph_, s_.stream());
      m.mark();
      moe.launch_combine(graph_, s_.stream());
      m.mark();
    });
  }

  void measure_ceiling(SizeResult& r) {
    const int me = s_.world().rank, W = s_.world().size;
    std::vector<uint64_t> dispatch_bytes(W), combine_bytes(W);
    for (int d = 0; d < W; ++d) {
      dispatch_bytes[d] = uint64_t(r.traffic.rows_between(me, d)) * r.traffic.dispatch_row_bytes;
      combine_bytes[d] = uint64_t(r.traffic.rows_between(d, me)) * r.traffic.combine_row_bytes;  // rows go back
    }
    r.ceiling_dispatch = reduce_phase(s_.world(), ceiling_->time(loop_, dispatch_bytes).phase_us[0]);
    r.ceiling_combine = reduce_phase(s_.world(), ceiling_->time(loop_, combine_bytes).phase_us[0]);
    r.has_ceiling = true;
  }

  void measure_nccl(SizeResult& r) {
    const NcclDispatchTiming d = nccl_->time_dispatch(loop_, r.traffic);
    r.nccl_counts = reduce_phase(s_.world(), d.counts.phase_us[0]);
    r.nccl_payload = reduce_phase(s_.world(), d.payload.phase_us[0]);
    r.nccl_dispatch = reduce_phase(s_.world(), sum_each(d.counts.phase_us[0], d.payload.phase_us[0]));
    r.nccl_wrong_counts = s_.world().sum(d.wrong_counts);
    r.nccl_combine = reduce_phase(s_.world(), nccl_->time_combine(loop_, r.traffic).phase_us[0]);
    r.has_nccl = true;
  }

  const Session& s_;
  const BenchOptions& o_;
  std::vector<int> sizes_;
  WorkloadSpec largest_;
  bool graph_ = false;
  LoopOptions loop_;
  std::unique_ptr<PeerCopyCeiling> ceiling_;
  std::unique_ptr<NcclBaseline> nccl_;
  std::string nccl_skipped_;
};

}  // namespace

namespace {

// The runner of a handle of this layout and wire, or NULL with *refusal the
// library's UNSUPPORTED message: one create for both questions (a probe
// handle first would create every communicator and workspace twice).  Collective.
std::unique_ptr<MoeEpRunner> runner_or_refusal(const Session& session, const WorkloadSpec& largest, bool zero_copy,
                                               std::string* refusal) {
  moe_ep_status_t status = MOE_EP_SUCCESS;
  auto runner = std::make_unique<MoeEpRunner>(session, largest, zero_copy, MOE_EP_ERROR_UNSUPPORTED, &status);
  if (status != MOE_EP_ERROR_UNSUPPORTED) return runner;
  *refusal = moe_ep_last_error();
  return nullptr;
}

// Each (wire, layout)'s sweep, one after the other; the first one's with the baselines.
void run_sweep(const Session& session, const BenchOptions& options, BenchReport& report, BenchResults& results) {
  const std::vector<int> sizes = bench_sizes(options);
  const BenchOptions o =
      with_expert_rows(options, session.world().size, sizes, *std::max_element(sizes.begin(), sizes.end()));
  const std::vector<std::string> wires = bench_wires(o.wire);
  const std::vector<std::string> layout_names = bench_layouts(o.layout);
  std::vector<std::pair<std::string, std::string>> variants;  // (wire, layout)
  for (const std::string& wire : wires) {
    for (const std::string& layout : layout_names) variants.emplace_back(wire, layout);
  }
  const bool several = layout_names.size() > 1, several_wires = wires.size() > 1;
  for (size_t i = 0; i < variants.size(); ++i) {
    const std::string& wire = variants[i].first;
    const std::string& layout = variants[i].second;
    const BenchOptions one = with_wire(with_layout(o, layout), wire);
    Sweep sweep(session, one, bench_sizes(one), o.baselines && i == 0);
    if (!sweep.nccl_skipped().empty() && session.world().is_root()) {
      std::printf("# NCCL baseline skipped: %s\n", sweep.nccl_skipped().c_str());
    }
    const bool user = layout == "rank_major+user";
    std::string skipped = user ? user_permute_refusal(session.on_gpu(), sweep.largest()) : "";
    if (skipped.empty() && user && wire != "as_is") {
      skipped = "the reference permute kernels move the rows of an AS_IS wire (--wire as_is), without scales";
    }
    const bool separate = wire == "quantize+as_is";
    if (skipped.empty() && separate) {
      skipped = reference_quantize_refusal(session.on_gpu(), quantize_source(one, sweep.largest()));
    }
    const WorkloadSpec& largest = sweep.largest();
    std::unique_ptr<MoeEpRunner> moe;
    if (skipped.empty()) moe = runner_or_refusal(session, largest, o.zero_copy_combine, &skipped);
    if (!skipped.empty()) {
      if (wire != "as_is") {
        results.wires_skipped.emplace_back(several ? wire + " " + layout : wire, skipped);
        report.print_skipped("wire " + wire + (several ? " in layout " + layout : ""), skipped);
      } else {
        results.layouts_skipped.emplace_back(layout, skipped);
        report.print_skipped("layout " + layout, skipped);
      }
      continue;
    }
    if (largest.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) results.expert_capacity = o.expert_capacity;
    if (largest.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) results.expert_packed_rows = o.expert_packed_rows;
    if (i == 0) report.set_baselines(sweep.has_ceiling(), sweep.has_nccl());
    if (several || layout != "rank_major") {
      report.print_layout_heading(sweep.largest(), layout,
                                  largest.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR    ? o.expert_capacity_note
                                  : largest.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? o.expert_packed_rows_note
                                                                                          : "");
    }
    if (several_wires || wire != "as_is") report.print_wire_heading(sweep.largest(), wire);
    report.print_sweep_columns();
    const size_t first = results.sweep.size();
    {
      std::unique_ptr<UserPermute> reference;
      if (user) {
        const int alignment = o.expert_alignment ? o.expert_alignment : 1;
        reference = std::make_unique<UserPermute>(session.place(), sweep.largest(), session.world().rank, alignment);
      }
      std::unique_ptr<ReferenceQuantize> quantize;
      if (separate) quantize = std::make_unique<ReferenceQuantize>(session.place(), quantize_source(one, largest));
      for (int tokens : sweep.sizes()) {
        results.sweep.push_back(sweep.measure(*moe, tokens, reference.get(), quantize.get()));
        report.print_row(results.sweep.back());
      }
      moe.reset();
    }
    if (i == 0) {
      report.print_baselines(std::vector<SizeResult>(results.sweep.begin() + long(first), results.sweep.end()));
    }
  }
  if (several) report.print_layouts(results.sweep);
  if (several_wires) report.print_wires(results.sweep);
}

std::vector<std::string> grouped_expert_note(const WorkloadSpec& w, int intermediate, const std::string& rows_note) {
  char weights[64];
  std::snprintf(weights, sizeof weights, "%.1f MB",
                double(grouped_expert_weight_bytes(w.hidden_size, intermediate)) / 1e6);
  return {"expert: grouped GEMM (cuBLAS cublasGemmGroupedBatchedEx) on the EXPERT_PACKED rows (alignment " +
              std::to_string(w.alignment()) + ", " + std::to_string(w.packed_rows()) + " rows: " + rows_note +
              "), per local expert n_e x " + std::to_string(2 * intermediate) + " x " + std::to_string(w.hidden_size) +
              " and n_e x " + std::to_string(w.hidden_size) + " x " + std::to_string(intermediate) +
              ", bf16, fp32 accumulation; group sizes from the tool's routing, fixed per size",
          "  one group per local expert with rows (experts without rows are left out); each group reads its "
          "expert's weights, " +
              std::string(weights) +
              ", so at few tokens the expert part is the weights of the experts with rows over the memory "
              "bandwidth (the row's \"weights\" column: groups, bytes, bytes / expert time), not cuBLAS's "
              "cost per group"};
}

// The options of a mode with the grouped-GEMM expert: its rows in EXPERT_PACKED.
BenchOptions expert_options(const BenchOptions& o) {
  return o.expert_gemm == "grouped" ? with_layout(o, "expert_packed") : o;
}

void run_decode_step(const Session& session, const BenchOptions& options, BenchReport& report, BenchResults& results) {
  const std::vector<int> sizes = decode_step_sizes(options);
  const BenchOptions o = with_expert_rows(expert_options(options), session.world().size, sizes,
                                          *std::max_element(sizes.begin(), sizes.end()));
  const bool grouped = o.expert_gemm == "grouped";
  Sweep sweep(session, o, sizes, false);
  const std::string refusal =
      grouped ? grouped_expert_refusal(session.on_gpu(), sweep.largest()) : stand_in_expert_refusal(sweep.largest());
  if (!refusal.empty()) fail(refusal);
  std::string no_layout;  // a backend without EXPERT_PACKED: skipped with the library's reason
  const std::unique_ptr<MoeEpRunner> runner =
      runner_or_refusal(session, sweep.largest(), o.zero_copy_combine, &no_layout);
  if (!runner) {
    report.print_skipped(grouped ? "decode step with the grouped-GEMM expert" : "decode step", no_layout);
    return;
  }
  MoeEpRunner& moe = *runner;
  if (grouped) results.expert_packed_rows = o.expert_packed_rows;
  std::unique_ptr<GroupedExpert> expert;
  if (grouped) {
    expert = std::make_unique<GroupedExpert>(sweep.largest(), o.expert_intermediate, 0,
                                             derive(session.options().seed, 0x6e));
    expert->bind(static_cast<cudaStream_t>(session.stream()));  // outside the captures
  }
  if (grouped) {
    for (const std::string& line :
         grouped_expert_note(sweep.largest(), o.expert_intermediate, o.expert_packed_rows_note))
      report.print_note(line);
  }
  DecodeStep step(moe, sweep.graph(), expert.get());
  for (int tokens : sweep.sizes()) {
    DecodeStepResult r = sweep.measure_decode_step(step, tokens);
    if (results.decode_step.empty()) {
      results.decode_split_skipped = step.split_refusal();
      report.print_decode_step_columns(step.split_refusal());
    }
    results.decode_step.push_back(std::move(r));
    report.print_decode_step_row(results.decode_step.back());
  }
}

void run_micro_batch(const Session& session, const BenchOptions& options, BenchReport& report, BenchResults& results) {
  std::vector<int> halves;  // each micro-batch's tokens per rank
  for (int t : micro_batch_sizes(options)) halves.push_back(std::max(1, t / 2));
  const BenchOptions o = with_expert_rows(expert_options(options), session.world().size, halves,
                                          *std::max_element(halves.begin(), halves.end()));
  Sweep sweep(session, o, micro_batch_sizes(o), false);
  results.expert_intermediate = o.expert_intermediate;
  results.expert_rows = o.expert_rows;
  const WorkloadSpec largest = sweep.micro_batch_spec(sweep.largest().max_tokens_per_rank);
  const bool grouped = o.expert_gemm == "grouped";
  results.micro_batch_skipped = grouped ? grouped_expert_refusal(session.on_gpu(), largest) : "";
  if (results.micro_batch_skipped.empty()) {
    results.micro_batch_skipped = micro_batch_refusal(session, largest, o.expert_intermediate);
  }
  if (results.micro_batch_skipped.empty()) {
    if (grouped) {
      for (const std::string& line : grouped_expert_note(largest, o.expert_intermediate, o.expert_packed_rows_note))
        report.print_note(line);
      results.expert_packed_rows = o.expert_packed_rows;
    }
    MicroBatchOverlap overlap(session, largest, o.expert_intermediate, o.expert_rows == "rows", sweep.graph(), grouped);
    results.micro_batch_skipped = overlap.probe(sweep.micro_batch_spec(sweep.sizes().front()));
    if (results.micro_batch_skipped.empty()) {
      report.print_micro_batch_columns(overlap.sm_target());
      for (int tokens : sweep.sizes()) {
        results.micro_batch.push_back(sweep.measure_micro_batch(overlap, tokens));
        report.print_micro_batch_row(results.micro_batch.back());
      }
      return;
    }
  }
  report.print_skipped("micro-batch overlap", results.micro_batch_skipped);
}

void run_no_sm_held(const Session& session, const BenchOptions& o, BenchReport& report, BenchResults& results) {
  results.no_sm_held_skipped = overlap_refusal(session, "--no-sm-held");
  if (results.no_sm_held_skipped.empty()) {
    Sweep sweep(session, o, no_sm_held_sizes(o), false);
    MoeEpRunner moe(session, sweep.largest(), false);
    const WorkloadSpec first =
        bench_spec(o, session.world().size, sweep.largest().max_tokens_per_rank, sweep.sizes().front());
    const std::vector<RankRouting> all = make_all_routing(first);
    moe.load(first, all);
    results.no_sm_held_skipped = moe.probe_split();
    if (results.no_sm_held_skipped.empty()) {
      NoSmHeld held(session, o.gemm_mnk);
      report.print_no_sm_held_columns(held.shape());
      for (int tokens : sweep.sizes()) {
        results.no_sm_held.push_back(sweep.measure_loaded(moe, held, tokens));
        report.print_no_sm_held_row(results.no_sm_held.back());
      }
      return;
    }
  }
  report.print_skipped("no SM held", results.no_sm_held_skipped);
}

void run_overlap(const Session& session, const BenchOptions& o, BenchReport& report, BenchResults& results) {
  results.overlap_skipped = overlap_refusal(session);
  if (!results.overlap_skipped.empty()) {
    report.print_skipped("overlap with a GEMM", results.overlap_skipped);
    return;
  }
  Sweep sweep(session, o, overlap_sizes(o), false);
  MoeEpRunner moe(session, sweep.largest(), o.zero_copy_combine);
  GemmOverlap overlap(session, o.gemm_mnk);
  report.print_overlap_columns(overlap.sm_target(), overlap.auto_shape());
  for (int tokens : sweep.sizes()) {
    results.overlap.push_back(sweep.measure_loaded(moe, overlap, tokens));
    report.print_overlap_row(results.overlap.back());
  }
}

// The largest workload of every measurement this run makes (for the header).
WorkloadSpec largest_shape(const BenchOptions& options, int world) {
  const BenchOptions o =
      with_wire(with_layout(expert_options(options), bench_layouts(expert_options(options).layout).front()),
                bench_wires(options.wire).front());
  std::vector<int> sizes;
  if (!o.special_mode()) sizes = bench_sizes(o);
  if (o.decode_step) sizes = decode_step_sizes(o);
  auto add = [&](const std::vector<int>& more) { sizes.insert(sizes.end(), more.begin(), more.end()); };
  if (o.overlap_gemm) add(overlap_sizes(o));
  if (o.no_sm_held) add(no_sm_held_sizes(o));
  if (o.micro_batch_overlap) {  // its handle holds one micro-batch: half a step
    for (int t : micro_batch_sizes(o)) sizes.push_back(std::max(1, t / 2));
  }
  if (sizes.empty()) fail("no sizes: -b must be <= -e");
  const int largest = *std::max_element(sizes.begin(), sizes.end());
  return bench_spec(with_expert_rows(o, world, sizes, largest), world, largest, largest);
}

}  // namespace

int run_bench(const World& world, const BenchOptions& o) {
  const WorkloadSpec shape = largest_shape(o, world.size);
  Session session(world, o.common);
  if (!session.skip_reason().empty()) {
    if (world.is_root()) std::printf("# moe_ep_conformance bench: skipped: %s\n", session.skip_reason().c_str());
    return 0;
  }
  BenchReport report(session, o, shape, o.graph && session.on_gpu());
  report.print_header();
  BenchResults results;
  if (!o.special_mode()) run_sweep(session, o, report, results);
  if (o.decode_step) run_decode_step(session, o, report, results);
  if (o.overlap_gemm) run_overlap(session, o, report, results);
  if (o.micro_batch_overlap) run_micro_batch(session, o, report, results);
  if (o.no_sm_held) run_no_sm_held(session, o, report, results);
  const bool ok = report.print_footer(results);
  if (!o.json_path.empty()) report.write_json(results, o.json_path);
  return ok ? 0 : 1;
}

}  // namespace moe_ep_tool
