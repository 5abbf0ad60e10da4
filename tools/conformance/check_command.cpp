#include "check.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <thread>

#include "counter_rng.hpp"
#include "dtypes.hpp"
#include "ep_calls.hpp"
#include "errors.hpp"
#include "graph_capture.hpp"

namespace moe_ep_tool {

namespace {

// --inactive-ranks as an active-rank mask; ToolError for a rank outside the world.
std::vector<uint8_t> active_mask(const std::vector<int>& inactive, int world) {
  std::vector<uint8_t> active(static_cast<size_t>(world), 1);
  for (int r : inactive) {
    if (r < 0 || r >= world) {
      fail("--inactive-ranks: expected ranks in [0, " + std::to_string(world) + "), got " + std::to_string(r));
    }
    active[static_cast<size_t>(r)] = 0;
  }
  return active;
}

uint64_t name_hash(const std::string& name) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: seeds do not move when cases are filtered
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// The case's workload in a round: fresh routing and payload every round;
// token counts fresh too, except in graph rounds (a captured graph holds its
// token counts, so they share one draw).
WorkloadSpec case_spec(uint64_t seed, const CheckCase& c, int world, int round, bool fixed_counts) {
  const uint64_t case_key = derive(seed, name_hash(c.name));
  const uint64_t key = derive(case_key, uint64_t(round));
  return instantiate(c, world, key, fixed_counts ? derive(case_key, 0x5bd1e995) : key);
}

// Graph rounds are numbered from here, apart from the eager ones; split rounds from kFirstSplitRound.
constexpr int kFirstGraphRound = 100;
constexpr int kFirstSplitRound = 200;

// Runs one case in one mode on this rank; every rank runs the same sequence.
class CaseRunner {
 public:
  CaseRunner(const Session& session, const CheckOptions& options, const CheckCase& c)
      : s_(session),
        o_(options),
        c_(c),
        me_(session.world().rank),
        fault_(me_ == 0 ? parse_fault(options.inject_fault) : Fault::none),
        active_(active_mask(options.inactive_ranks, session.world().size)) {}

  // Eager: `rounds` dispatch/combine pairs on one handle with fresh inputs and
  // token counts each time; results owned by the caller and by the library
  // alternate, and so do the 2-D and 3-D expert_output forms.
  // A backend without the case's receive layout answers UNSUPPORTED at create
  // (the same on every rank); `skipped` then holds its message.
  void run_eager(Verdict& v, std::string& skipped) {
    const WorkloadSpec first = spec(0, false);
    moe_ep_status_t created = MOE_EP_SUCCESS;
    EpHandle handle(s_.bootstrap(), first.params(), config(), MOE_EP_ERROR_UNSUPPORTED, &created);
    if (created == MOE_EP_ERROR_UNSUPPORTED || !apply_mask(handle)) {
      skipped = moe_ep_last_error();
      return;
    }
    Buffers b(first, s_.place());
    for (int round = 0; round < o_.rounds; ++round) eager_round(handle, b, spec(round, false), round, v);
  }

  // Graph: dispatch and combine captured once (fixed token counts), replayed
  // on new inputs twice, then one eager call on the same handle.  With
  // --inactive-ranks the mask is set between the two replays: a captured
  // graph must follow it.
  void run_graph(Verdict& v, std::string& skipped) {
    const WorkloadSpec first = spec(kFirstGraphRound, true);
    moe_ep_status_t created = MOE_EP_SUCCESS;
    EpHandle handle(s_.bootstrap(), first.params(), config(), MOE_EP_ERROR_UNSUPPORTED, &created);
    if (created == MOE_EP_ERROR_UNSUPPORTED) {
      skipped = moe_ep_last_error();
      return;
    }
    Buffers b(first, s_.place());
    b.inputs.load(first, me_, make_routing(first, me_), s_.stream());
    moe_ep_dispatch_result_t dr;
    moe_ep_combine_result_t cr;
    {
      CapturedCall dispatch(s_.stream(), [&](void* st) { return b.inputs.dispatch(handle.get(), first, &dr, st); });
      // Zero-copy: the view's address is fixed per handle, so the captured
      // combine reads whatever each replay wrote there.
      const void* expert_output = c_.zero_copy ? dr.combine_input.data : b.expert_output.data();
      CapturedCall combine(s_.stream(), [&](void* st) {
        return run_combine(handle.get(), first, s_.place(), expert_output, false, &b.output, b.inputs.num_tokens(), &cr,
                           st);
      });
      for (int replay = 0; replay < 2; ++replay) {
        // --inactive-ranks: the graph was captured with every rank active;
        // its second replay runs under the mask, without recapture.
        if (replay == 1 && !apply_mask(handle)) {
          skipped = moe_ep_last_error();
          return;
        }
        const WorkloadSpec w = spec(kFirstGraphRound + replay, true);
        const std::vector<RankRouting> all = make_all_routing(w);
        b.inputs.load(w, me_, all[me_], s_.stream());
        if (b.inputs.num_tokens() != first.tokens[me_]) fail("tool bug: graph replay with a different token count");
        dispatch.launch(s_.stream());
        verify_dispatch(w, all, dr, v);
        load_expert_output(w, b, dr);
        b.output.fill(0xFF, s_.stream());
        combine.launch(s_.stream());
        verify_combine(w, all, cr, b.output.data(), b.inputs.num_tokens(), v);
        verify_async(w, all, handle, v);
      }
    }
    eager_round(handle, b, spec(kFirstGraphRound + 2, true), 0, v);
  }

  // Split: the eager rounds through the halves, two micro-batches in flight on
  // one handle with two slots, interleaved as a server overlapping them would:
  //   A.dispatch_send B.dispatch_send A.dispatch_recv A.combine_send
  //   B.dispatch_recv B.combine_send A.combine_recv B.combine_recv
  // A backend without halves (or without the case's receive layout) answers
  // UNSUPPORTED (at create, or at the first send half: the same on every
  // rank, before anything moves); `skipped` then holds its message and
  // nothing is checked.
  void run_split(Verdict& v, std::string& skipped) {
    const WorkloadSpec first = spec(kFirstSplitRound, false);
    moe_ep_config_t cfg = config();
    cfg.micro_batches = 2;
    moe_ep_status_t created = MOE_EP_SUCCESS;
    EpHandle handle(s_.bootstrap(), first.params(), cfg, MOE_EP_ERROR_UNSUPPORTED, &created);
    if (created == MOE_EP_ERROR_UNSUPPORTED || !apply_mask(handle)) {
      skipped = moe_ep_last_error();
      return;
    }
    Buffers a(first, s_.place()), b(first, s_.place());
    for (int round = 0; round < o_.rounds; round += 2) {
      const bool two = round + 1 < o_.rounds;
      const WorkloadSpec wa = spec(kFirstSplitRound + round, false);
      const WorkloadSpec wb = spec(kFirstSplitRound + round + 1, false);
      const std::vector<RankRouting> all_a = make_all_routing(wa), all_b = make_all_routing(wb);
      a.inputs.load(wa, me_, all_a[me_], s_.stream());
      if (two) b.inputs.load(wb, me_, all_b[me_], s_.stream());
      const moe_ep_status_t sent = a.inputs.dispatch_send(handle.get(), 0, wa, s_.stream());
      if (sent == MOE_EP_ERROR_UNSUPPORTED) {
        skipped = moe_ep_last_error();
        return;
      }
      TOOL_CHECK_MOE(sent);
      if (two) TOOL_CHECK_MOE(b.inputs.dispatch_send(handle.get(), 1, wb, s_.stream()));
      const bool caller_output = round % 4 == 0, as_3d = round % 3 == 1;
      receive_and_send_combine(handle, a, 0, wa, all_a, as_3d, v);
      if (two) receive_and_send_combine(handle, b, 1, wb, all_b, !as_3d, v);
      receive_combine(handle, a, 0, wa, all_a, caller_output, v);
      if (two) receive_combine(handle, b, 1, wb, all_b, !caller_output, v);
      std::vector<std::pair<const WorkloadSpec*, const std::vector<RankRouting>*>> batches = {{&wa, &all_a}};
      if (two) batches.push_back({&wb, &all_b});
      verify_async(batches, handle, v);
    }
  }

 private:
  struct Buffers {
    Buffers(const WorkloadSpec& w, const Place& place)
        : inputs(w, place),
          expert_output(place, uint64_t(w.combine_rows()) * w.combine_row_bytes()),
          output(place, uint64_t(w.max_tokens_per_rank) * w.combine_row_bytes()) {}
    DispatchInputs inputs;
    Buffer expert_output, output;
  };

  moe_ep_config_t config() const { return with_zero_copy_combine(s_.config(), c_.zero_copy); }

  bool masked() const {
    for (uint8_t a : active_) {
      if (!a) return true;
    }
    return false;
  }

  // --inactive-ranks: the mask on a new handle.  False when the backend has
  // no masks (UNSUPPORTED, the same answer on every rank: the run is skipped).
  bool apply_mask(EpHandle& handle) {
    if (!masked()) return true;
    const moe_ep_status_t st =
        moe_ep_set_active_ranks(handle.get(), active_.data(), static_cast<int32_t>(active_.size()));
    if (st == MOE_EP_ERROR_UNSUPPORTED) return false;
    TOOL_CHECK_MOE(st);
    mask_applied_ = true;
    return true;
  }

  // What every rank must receive: the oracle on the routing as the library
  // routes it under the mask once it is set (the inputs stay the unmasked
  // routing).
  std::vector<RankRouting> expected(const WorkloadSpec& w, const std::vector<RankRouting>& all) const {
    return mask_applied_ ? mask_routing(w, all, active_) : all;
  }

  // Where this round's expert output goes: the tool's buffer, or (zero-copy)
  // the dispatch result's combine_input view.  Returns what combine gets.
  const void* load_expert_output(const WorkloadSpec& w, Buffers& b, const moe_ep_dispatch_result_t& dr) {
    if (c_.zero_copy) return fill_combine_input(w, me_, s_.place(), dr, s_.stream());
    b.expert_output.upload(make_expert_output(w, me_), s_.stream());
    return b.expert_output.data();
  }

  WorkloadSpec spec(int round, bool fixed_counts) const {
    return case_spec(s_.options().seed, c_, s_.world().size, round, fixed_counts);
  }

  void eager_round(EpHandle& handle, Buffers& b, const WorkloadSpec& w, int round, Verdict& v) {
    const std::vector<RankRouting> all = make_all_routing(w);
    b.inputs.load(w, me_, all[me_], s_.stream());
    moe_ep_dispatch_result_t dr;
    TOOL_CHECK_MOE(b.inputs.dispatch(handle.get(), w, &dr, s_.stream()));
    verify_dispatch(w, all, dr, v);
    const void* expert_output = load_expert_output(w, b, dr);
    const bool caller_output = round % 2 == 0, as_3d = round % 3 == 1;
    if (caller_output) b.output.fill(0xFF, s_.stream());  // poison: every element must be written
    moe_ep_combine_result_t cr;
    TOOL_CHECK_MOE(run_combine(handle.get(), w, s_.place(), expert_output, as_3d, caller_output ? &b.output : nullptr,
                               b.inputs.num_tokens(), &cr, s_.stream()));
    verify_combine(w, all, cr, caller_output ? b.output.data() : nullptr, b.inputs.num_tokens(), v);
    verify_async(w, all, handle, v);
  }

  // dispatch_recv of `slot`, checked; then its expert output, and combine_send.
  void receive_and_send_combine(EpHandle& handle, Buffers& b, int32_t slot, const WorkloadSpec& w,
                                const std::vector<RankRouting>& all, bool as_3d, Verdict& v) {
    moe_ep_dispatch_result_t dr;
    TOOL_CHECK_MOE(moe_ep_dispatch_result_init(&dr, sizeof dr));
    TOOL_CHECK_MOE(moe_ep_dispatch_recv(handle.get(), slot, &dr, s_.stream()));
    verify_dispatch(w, all, dr, v);
    const void* expert_output = load_expert_output(w, b, dr);
    TOOL_CHECK_MOE(run_combine_send(handle.get(), slot, w, s_.place(), expert_output, as_3d, s_.stream()));
  }

  void receive_combine(EpHandle& handle, Buffers& b, int32_t slot, const WorkloadSpec& w,
                       const std::vector<RankRouting>& all, bool caller_output, Verdict& v) {
    if (caller_output) b.output.fill(0xFF, s_.stream());  // poison: every element must be written
    moe_ep_combine_result_t cr;
    TOOL_CHECK_MOE(run_combine_recv(handle.get(), slot, w, s_.place(), caller_output ? &b.output : nullptr,
                                    b.inputs.num_tokens(), &cr, s_.stream()));
    verify_combine(w, all, cr, caller_output ? b.output.data() : nullptr, b.inputs.num_tokens(), v);
  }

  void verify_dispatch(const WorkloadSpec& w, const std::vector<RankRouting>& all, const moe_ep_dispatch_result_t& dr,
                       Verdict& v) {
    ReceivedDispatch got = read_dispatch(w, dr, s_.place().dlpack(), reader(s_.place(), s_.stream()), v);
    inject_fault(fault_, w, got);
    v.merge(check_dispatch(w, expected(w, all), me_, got));
    if (o_.poison_results) poison_dispatch_payload(w, s_.place(), dr, s_.stream());
  }

  void verify_combine(const WorkloadSpec& w, const std::vector<RankRouting>& all, const moe_ep_combine_result_t& cr,
                      const void* caller_output, int num_tokens, Verdict& v) {
    if (caller_output && num_tokens > 0 && cr.output.data != caller_output) {
      v.add(1, "combine result: expected a view of the caller's output tensor");
    }
    std::vector<uint8_t> out = read_combine(w, cr, num_tokens, s_.place().dlpack(), reader(s_.place(), s_.stream()), v);
    inject_fault(fault_, w, out);
    if (num_tokens > 0) v.merge(check_combine(w, expected(w, all), me_, out));
  }

  // Bad ids must be reported (INVALID_INPUT) on the rank that passed them;
  // without bad ids anywhere, nothing may be reported.
  void verify_async(const WorkloadSpec& w, const std::vector<RankRouting>& all, EpHandle& handle, Verdict& v) {
    verify_async({{&w, &all}}, handle, v);
  }

  // The same for the calls of several workloads since the last query (the two micro-batches of a split round).
  void verify_async(const std::vector<std::pair<const WorkloadSpec*, const std::vector<RankRouting>*>>& batches,
                    EpHandle& handle, Verdict& v) {
    auto has_bad = [&](const WorkloadSpec& w, const RankRouting& r) {
      for (int32_t id : r.topk_ids) {
        if (w.owner(id) < 0 && id != w.invalid_expert_id) return true;
      }
      return false;
    };
    bool any_bad = false, mine_bad = false;
    for (const auto& batch : batches) {
      for (const RankRouting& r : *batch.second) any_bad = any_bad || has_bad(*batch.first, r);
      mine_bad = mine_bad || has_bad(*batch.first, (*batch.second)[me_]);
    }
    moe_ep_status_t status = MOE_EP_SUCCESS;
    TOOL_CHECK_MOE(moe_ep_get_async_error(handle.get(), &status));
    const bool ok = mine_bad ? status == MOE_EP_ERROR_INVALID_INPUT
                             : status == MOE_EP_SUCCESS || (any_bad && status == MOE_EP_ERROR_INVALID_INPUT);
    if (!ok) {
      v.add(1, std::string("moe_ep_get_async_error: got ") + moe_ep_status_string(status) +
                   (mine_bad ? ", expected MOE_EP_ERROR_INVALID_INPUT for bad ids" : ", expected SUCCESS") +
                   (status != MOE_EP_SUCCESS ? std::string(": ") + moe_ep_last_error() : ""));
    }
  }

  const Session& s_;
  const CheckOptions& o_;
  const CheckCase& c_;
  int me_;
  Fault fault_;
  std::vector<uint8_t> active_;  // --inactive-ranks as a mask (every rank active without it)
  bool mask_applied_ = false;    // set on this runner's handle (graph mode: from its second replay on)
};

std::string tokens_text(const std::vector<int>& tokens) {
  std::string s = "[";
  for (size_t i = 0; i < tokens.size() && i < 4; ++i) s += (i ? "," : "") + std::to_string(tokens[i]);
  return s + (tokens.size() > 4 ? ",..]" : "]");
}

std::string payload_text(const WorkloadSpec& w) {
  return dtype_name(w.hidden_dtype) + "x" + std::to_string(w.row_elems());
}

std::string scales_text(const WorkloadSpec& w) {
  return w.scale_row_elems ? dtype_name(w.scale_dtype) + "x" + std::to_string(w.scale_row_elems) : "-";
}

// The layout column's suffix for a run's wire (--wire).
const char* wire_suffix(int wire) {
  if (wire == kWireFp8Dequantize) return "+fp8dq";
  if (wire == kWireFp8DispatchOnly) return "+fp8d";
  return wire == MOE_EP_WIRE_AS_IS ? "" : "+fp8";
}

// The layout column: the longest layout name and wire suffix, "expert_packed+fp8dq".
constexpr int kLayoutColumn = 19;

void print_header(const Session& s, const CheckOptions& o, size_t cases) {
  const std::vector<std::string> lines = s.rank_lines();
  if (!s.world().is_root()) return;
  std::printf("# moe_ep_conformance check: %s, backend %s, %d ranks, seed %llu, %d eager rounds per case, %zu cases\n",
              Session::version_line().c_str(), s.backend_label().c_str(), s.world().size,
              static_cast<unsigned long long>(o.common.seed), o.rounds, cases);
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  if (o.zero_copy_combine) std::printf("# every case with config.zero_copy_combine, expert output in the view\n");
  if (o.phases != "fused") {
    std::printf(
        "# phases %s: split cases run through moe_ep_dispatch_send/recv and moe_ep_combine_send/recv, two "
        "micro-batches in flight (config.micro_batches = 2)\n",
        o.phases.c_str());
  }
  std::printf("# receive layouts: %s\n", o.layouts.c_str());
  std::printf(
      "# wire formats: %s (fp8: column layout \"+fp8\"; dispatch_wire FP8 where the rows are bf16, fp16 or fp32 "
      "without scales, combine_wire FP8 always; fp8_dispatch: \"+fp8d\", that dispatch_wire only; fp8_dequantize: "
      "\"+fp8dq\", "
      "that dispatch_wire with dispatch_dequantize)\n",
      o.wires.c_str());
  std::printf("# wire scales: %s (params->wire_scale of the FP8 wires)\n", o.wire_scale.c_str());
  if (!o.inactive_ranks.empty()) {
    std::string ranks;
    for (int r : o.inactive_ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    std::printf(
        "# inactive ranks: %s (moe_ep_set_active_ranks after create, in graph mode between the two replays; results "
        "against the oracle with their experts and tokens masked)\n",
        ranks.c_str());
  }
  std::printf("#\n# %-22s %-6s %-*s %5s %4s %5s %4s %6s %-16s %-13s %-8s %-14s %8s  %s\n", "case", "mode",
              kLayoutColumn, "layout", "E", "K", "maxT", "tpr", "H", "hidden", "scales", "combine", "tokens/rank",
              "#wrong", "result");
  std::fflush(stdout);
}

}  // namespace

int run_check(const World& world, const CheckOptions& o) {
  std::vector<CheckCase> cases;
  for (const CheckCase& c : check_cases()) {
    if (c.name.find(o.filter) == std::string::npos) continue;
    cases.push_back(c);
    if (o.zero_copy_combine) cases.back().zero_copy = true;
  }
  if (cases.empty()) {  // the same on every rank: every rank refuses alone, before any collective
    if (world.is_root()) {
      std::fprintf(stderr,
                   "moe_ep_conformance: --filter: expected a part of some case's name (see check --list), got '%s'\n",
                   o.filter.c_str());
    }
    return 2;
  }
  if (o.list) {
    if (world.is_root()) {
      for (const CheckCase& c : cases) std::printf("%s\n", c.name.c_str());
    }
    return 0;
  }
  active_mask(o.inactive_ranks, world.size);  // a rank outside the world: refused on every rank alike
  Session session(world, o.common);
  if (!session.skip_reason().empty()) {
    if (world.is_root()) std::printf("# moe_ep_conformance check: skipped: %s\n", session.skip_reason().c_str());
    return 0;
  }
  const bool gpu = session.on_gpu();
  const bool fused = o.phases != "split", split = o.phases == "split" || o.phases == "both";
  if (o.phases != "fused" && o.phases != "split" && o.phases != "both") {
    fail("--phases must be fused, split or both, got '" + o.phases + "'");
  }
  const bool eager = fused && o.modes != "graph",
             graph = fused && (o.modes == "graph" || o.modes == "both" || (o.modes == "auto" && gpu));
  if (o.modes != "auto" && o.modes != "eager" && o.modes != "graph" && o.modes != "both") {
    fail("--modes must be eager, graph, both or auto, got '" + o.modes + "'");
  }
  if (graph && !gpu) {
    fail("--modes " + o.modes + ": CUDA graphs need a GPU backend (this run uses " + session.backend_name() + ")");
  }
  const std::vector<int> layouts = parse_layouts(o.layouts);
  const std::vector<int> wires = parse_wires(o.wires);
  const int wire_scale = parse_wire_scale(o.wire_scale);
  std::vector<CheckCase> runs;  // every case in every layout it belongs to, with every wire
  for (const CheckCase& c : cases) {
    for (int layout : layouts) {
      if (layout == MOE_EP_LAYOUT_RANK_MAJOR && c.expert_layouts_only) continue;
      for (int wire : wires) {
        runs.push_back(c);
        runs.back().layout = layout;
        runs.back().wire = wire;
        runs.back().wire_scale = wire_scale;
      }
    }
  }
  print_header(session, o, runs.size());

  int64_t total_wrong = 0;
  int passed = 0, failed = 0, skipped = 0;
  std::string skip_reason, last_printed_skip;
  for (const CheckCase& c : runs) {
    for (const char* mode : {"eager", "graph", "split"}) {
      if ((mode[0] == 'e' && !eager) || (mode[0] == 'g' && !graph) || (mode[0] == 's' && !split)) continue;
      Verdict v;
      std::string error, skip;
      CaseRunner runner(session, o, c);
      try {
        if (mode[0] == 'e') runner.run_eager(v, skip);
        if (mode[0] == 'g') runner.run_graph(v, skip);
        if (mode[0] == 's') runner.run_split(v, skip);
      } catch (const ToolError& e) {
        error = e.what();
      }
      const std::string layout_text = std::string(layout_name(c.layout)) + wire_suffix(c.wire);
      world.set_phase(std::string("check, case ") + c.name + " (" + mode + ", " + layout_text +
                      "): agreeing on its outcome");
      if (o.inject_fault == "stalled_rank" && world.rank == world.size - 1 && world.size > 1) {
        // Self-test of the tool's bounded collectives: this rank stops
        // answering, and rank 0 must abort the job within its bound.
        std::fprintf(stderr, "moe_ep_conformance: rank %d: --inject-fault stalled_rank: this rank stops here\n",
                     world.rank);
        std::fflush(stderr);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      const int64_t wrong = world.sum(v.wrong);
      const bool any_error = world.any(!error.empty());
      // UNSUPPORTED is a local answer, the same on every rank; agreed all the same.
      const bool was_skipped = world.any(!skip.empty()) && !any_error && wrong == 0;
      total_wrong += wrong;
      const bool ok = wrong == 0 && !any_error;
      if (was_skipped) {
        ++skipped;
        if (skip.empty()) skip = "another rank's backend refused the case (UNSUPPORTED)";
        if (skip_reason.empty()) skip_reason = skip;
      } else {
        ok ? ++passed : ++failed;
      }
      std::vector<std::string> notes;
      if (!ok) notes = world.gather_text(error.empty() ? v.details : "error: " + error + "\n" + v.details);
      if (!world.is_root()) continue;
      const bool graph_mode = mode[0] == 'g';
      const int first_round = graph_mode ? kFirstGraphRound : mode[0] == 's' ? kFirstSplitRound : 0;
      const WorkloadSpec w = case_spec(o.common.seed, c, world.size, first_round, graph_mode);
      std::printf("  %-22s %-6s %-*s %5d %4d %5d %4d %6d %-16s %-13s %-8s %-14s %8lld  %s\n", c.name.c_str(), mode,
                  kLayoutColumn, layout_text.c_str(), w.num_experts, w.top_k, w.max_tokens_per_rank,
                  w.tokens_per_rank(), w.hidden_size, payload_text(w).c_str(), scales_text(w).c_str(),
                  dtype_name(w.combine_dtype).c_str(), tokens_text(w.tokens).c_str(), static_cast<long long>(wrong),
                  was_skipped ? "SKIPPED"
                  : ok        ? "OK"
                  : any_error ? "ERROR"
                              : "WRONG");
      if (was_skipped && skip != last_printed_skip) {  // each reason once, where it first appears
        std::printf("#     skipped: %s\n", skip.c_str());
        last_printed_skip = skip;
      }
      for (size_t r = 0; r < notes.size(); ++r) {
        std::istringstream lines(notes[r]);
        for (std::string line; std::getline(lines, line);) std::printf("#     rank %zu: %s\n", r, line.c_str());
      }
      std::fflush(stdout);
    }
  }
  if (world.is_root()) {
    std::printf("# Wrong elements : %lld %s\n", static_cast<long long>(total_wrong), total_wrong ? "FAILED" : "OK");
    if (skipped > 0) {
      std::printf("# Skipped : %d case runs SKIPPED (UNSUPPORTED on this backend), first: %s\n", skipped,
                  skip_reason.c_str());
    }
    std::printf("# moe_ep_conformance check: %d passed, %d failed%s\n", passed, failed,
                skipped > 0 ? (", " + std::to_string(skipped) + " skipped").c_str() : "");
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace moe_ep_tool
