#include "bench_command.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>

#include "bench_report.hpp"
#include "counter_rng.hpp"
#include "dtypes.hpp"
#include "ep_calls.hpp"
#include "errors.hpp"
#include "graph_capture.hpp"
#include "nccl_baseline.hpp"
#include "peer_copy_ceiling.hpp"

namespace moe_ep_tool {

std::vector<int> bench_sizes(const BenchOptions& o) {
  if (!o.token_list.empty()) return o.token_list;
  std::vector<int> sizes;
  for (int64_t t = o.min_tokens; t <= o.max_tokens; t *= o.step_factor) sizes.push_back(int(t));
  return sizes;
}

namespace {

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
  return s;
}

// moe_ep at one size: inputs, an optional check pass, and the timed loop.
class MoeEpRunner {
 public:
  MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy)
      : s_(s),
        zero_copy_(zero_copy),
        handle_(s.bootstrap(), largest.params(), with_zero_copy_combine(s.config(), zero_copy)),
        inputs_(largest, s.place()),
        expert_output_(s.place(), uint64_t(largest.receive_rows()) * largest.combine_row_bytes()) {}

  void load(const WorkloadSpec& w, const std::vector<RankRouting>& all) {
    spec_ = w;
    all_ = &all;
    inputs_.load(w, me(), all[me()], s_.stream());
    expert_output_.upload(make_expert_output(w, me()), s_.stream());
    view_loaded_ = false;
  }

  // Eager calls (or replays of the captured graphs) checked once: (dispatch, combine) wrong.
  std::pair<int64_t, int64_t> check(bool graph) {
    load_view();
    Verdict d, c;
    if (graph) {
      capture();
      dispatch_graph_->launch(s_.stream());
    } else {
      TOOL_CHECK_MOE(dispatch(s_.stream()));
    }
    const ReceivedDispatch got = read_dispatch(spec_, dr_, s_.place().dlpack(), reader(s_.place(), s_.stream()), d);
    d.merge(check_dispatch(spec_, *all_, me(), got));
    if (graph) {
      combine_graph_->launch(s_.stream());
    } else {
      TOOL_CHECK_MOE(combine(s_.stream()));
    }
    const std::vector<uint8_t> out =
        read_combine(spec_, cr_, inputs_.num_tokens(), s_.place().dlpack(), reader(s_.place(), s_.stream()), c);
    if (inputs_.num_tokens() > 0) c.merge(check_combine(spec_, *all_, me(), out));
    moe_ep_status_t async = MOE_EP_SUCCESS;
    TOOL_CHECK_MOE(moe_ep_get_async_error(handle_.get(), &async));
    d.add(async != MOE_EP_SUCCESS ? 1 : 0, std::string("async error: ") + moe_ep_status_string(async));
    if (s_.world().is_root() && (d.wrong || c.wrong)) std::fprintf(stderr, "%s%s", d.details.c_str(), c.details.c_str());
    return {d.wrong, c.wrong};
  }

  LoopResult time(const LoopOptions& o, bool graph) {
    load_view();
    if (graph) capture();
    return time_loop(s_, o, 2, [&](Marks& m) {
      m.mark();
      if (graph) {
        dispatch_graph_->launch(s_.stream());
      } else {
        TOOL_CHECK_MOE(dispatch(s_.stream()));
      }
      m.mark();
      if (graph) {
        combine_graph_->launch(s_.stream());
      } else {
        TOOL_CHECK_MOE(combine(s_.stream()));
      }
      m.mark();
    });
  }

  void drop_graphs() {
    dispatch_graph_.reset();
    combine_graph_.reset();
  }

 private:
  int me() const { return s_.world().rank; }
  moe_ep_status_t dispatch(void* stream) { return inputs_.dispatch(handle_.get(), spec_, &dr_, stream); }
  moe_ep_status_t combine(void* stream) {
    const void* expert_output = zero_copy_ ? dr_.combine_input.data : expert_output_.data();
    return run_combine(handle_.get(), spec_, s_.place(), expert_output, false, nullptr, inputs_.num_tokens(), &cr_,
                       stream);
  }
  // --zero-copy-combine: one untimed pair writes this size's expert output into
  // the combine_input view; the timed pairs then combine from it.  This relies
  // on dispatch leaving the view's contents alone (true of every backend), and
  // check() would count a backend that did not as #wrong.
  void load_view() {
    if (!zero_copy_ || view_loaded_) return;
    TOOL_CHECK_MOE(dispatch(s_.stream()));
    fill_combine_input(spec_, me(), s_.place(), dr_, s_.stream());
    TOOL_CHECK_MOE(combine(s_.stream()));
    view_loaded_ = true;
  }
  void capture() {
    if (dispatch_graph_) return;
    dispatch_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return dispatch(st); });
    combine_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return combine(st); });
  }

  const Session& s_;
  bool zero_copy_ = false;
  bool view_loaded_ = false;
  EpHandle handle_;
  DispatchInputs inputs_;
  Buffer expert_output_;
  WorkloadSpec spec_;
  const std::vector<RankRouting>* all_ = nullptr;
  moe_ep_dispatch_result_t dr_{};
  moe_ep_combine_result_t cr_{};
  std::unique_ptr<CapturedCall> dispatch_graph_, combine_graph_;
};

std::vector<double> sum_each(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

class Sweep {
 public:
  Sweep(const Session& s, const BenchOptions& o) : s_(s), o_(o), sizes_(bench_sizes(o)) {
    const int largest = *std::max_element(sizes_.begin(), sizes_.end());
    largest_ = bench_spec(o, s.world().size, largest, largest);
    graph_ = o.graph && s.on_gpu();
    loop_.warmup = o.warmup;
    loop_.iters = o.iters;
    loop_.gated = o.launch_gate;
    const uint64_t row = std::max(largest_.hidden_row_bytes() + largest_.scale_row_bytes(), largest_.combine_row_bytes());
    if (o.baselines && PeerCopyCeiling::available(s)) ceiling_ = std::make_unique<PeerCopyCeiling>(s, largest * row);
    if (o.baselines && s.on_gpu() && s.world().size > 1) {
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

  SizeResult measure(MoeEpRunner& moe, int tokens) {
    SizeResult r;
    r.tokens = tokens;
    const WorkloadSpec w = bench_spec(o_, s_.world().size, largest_.max_tokens_per_rank, tokens);
    const std::vector<RankRouting> all = make_all_routing(w);
    r.traffic = measure_traffic(w, all);
    moe.load(w, all);
    if (o_.check) {
      const auto [d, c] = moe.check(graph_);
      r.wrong_dispatch = s_.world().sum(d);
      r.wrong_combine = s_.world().sum(c);
    }
    const LoopResult t = moe.time(loop_, graph_);
    moe.drop_graphs();
    r.dispatch = reduce_phase(s_.world(), t.phase_us[0]);
    r.combine = reduce_phase(s_.world(), t.phase_us[1]);
    r.gate_expired = t.gate_expired;
    if (ceiling_) measure_ceiling(r);
    if (nccl_) measure_nccl(r);
    return r;
  }

 private:
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

int run_bench(const World& world, const BenchOptions& o) {
  if (bench_sizes(o).empty()) fail("no sizes: -b must be <= -e");
  Session session(world, o.common);
  if (!session.skip_reason().empty()) {
    if (world.is_root()) std::printf("# moe_ep_conformance bench: skipped: %s\n", session.skip_reason().c_str());
    return 0;
  }
  Sweep sweep(session, o);
  if (!sweep.nccl_skipped().empty() && world.is_root()) {
    std::printf("# NCCL baseline skipped: %s\n", sweep.nccl_skipped().c_str());
  }
  BenchReport report(session, o, sweep.largest(), sweep.graph(), sweep.has_ceiling(), sweep.has_nccl());
  report.print_header();
  std::vector<SizeResult> results;
  {
    MoeEpRunner moe(session, sweep.largest(), o.zero_copy_combine);
    for (int tokens : sweep.sizes()) {
      results.push_back(sweep.measure(moe, tokens));
      report.print_row(results.back());
    }
  }
  report.print_baselines(results);
  const bool ok = report.print_footer(results);
  if (!o.json_path.empty()) report.write_json(results, o.json_path);
  return ok ? 0 : 1;
}

}  // namespace moe_ep_tool
