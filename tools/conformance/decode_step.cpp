#include "decode_step.hpp"

#include <cstdio>

#include "counter_rng.hpp"
#include "errors.hpp"
#include "stand_in_expert.hpp"

namespace moe_ep_tool {

DecodeStepResult DecodeStep::measure(const WorkloadSpec& w, const std::vector<RankRouting>& all,
                                     const WorkloadSpec& fresh, const std::vector<RankRouting>& fresh_all, bool check,
                                     const LoopOptions& loop) {
  const Session& s = runner_.session();
  DecodeStepResult r;
  r.tokens = w.tokens_per_rank();
  runner_.load(w, all);
  if (grouped_) {
    grouped_->set_rows(local_expert_rows(w, all, s.world().rank));  // fixed for this size
    r.expert_groups = grouped_->groups();
    r.expert_weight_bytes =
        uint64_t(r.expert_groups) * grouped_expert_weight_bytes(w.hidden_size, grouped_->intermediate());
    // One eager step first: cuBLAS sets itself up for these sizes outside the captures.
    TOOL_CHECK_MOE(runner_.dispatch(s.stream()));
    expert(s.stream());
    TOOL_CHECK_MOE(runner_.combine(s.stream()));
    TOOL_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(s.stream())));
  }
  if (!asked_split_) {  // one untimed split pair, before any graph holds the slot
    split_refusal_ = runner_.probe_split();
    asked_split_ = true;
  }
  r.has_split = split_refusal_.empty();
  capture_parts();
  if (check) check_parts(r);
  // Each step is captured after the checks before it, and checked before the
  // next capture: a capture replaces the runner's results with its own, and a
  // check reads the results its step's capture returned.
  capture_step(false);
  if (check) r.wrong_step = check_step(fresh, fresh_all, false, r.tokens);
  if (r.has_split) {
    capture_step(true);
    if (check) {  // other inputs again: nothing of the fused step's may pass for the split one's
      WorkloadSpec other = fresh;
      other.seed = derive(fresh.seed, 0x5b1);
      const std::vector<RankRouting> other_all = make_all_routing(other);
      r.wrong_split_step = check_step(other, other_all, true, r.tokens);
    }
  }
  if (check) runner_.load(w, all);
  const LoopResult t = time_loop(s, loop, r.has_split ? 5 : 4, [&](Marks& m) {
    m.mark();
    runner_.launch_dispatch(graph_, s.stream());
    m.mark();
    launch_expert(s.stream());
    m.mark();
    runner_.launch_combine(graph_, s.stream());
    m.mark();
    launch_step(s.stream());
    m.mark();
    if (!r.has_split) return;
    launch_split_step(s.stream());
    m.mark();
  });
  runner_.drop_graphs();
  expert_graph_.reset();
  step_graph_.reset();
  split_graph_.reset();
  const World& world = s.world();
  r.dispatch = reduce_phase(world, t.phase_us[0]);
  r.expert = reduce_phase(world, t.phase_us[1]);
  r.combine = reduce_phase(world, t.phase_us[2]);
  r.step = reduce_phase(world, t.phase_us[3]);
  if (r.has_split) r.split_step = reduce_phase(world, t.phase_us[4]);
  r.parts = reduce_phase(world, sum_each(sum_each(t.phase_us[0], t.phase_us[1]), t.phase_us[2]));
  r.gate_expired = t.gate_expired;
  return r;
}

void DecodeStep::expert(void* stream) {
  if (grouped_) {
    grouped_->run(runner_.dispatch_result(), static_cast<cudaStream_t>(stream));
    return;
  }
  const StandInExpertArgs args =
      stand_in_expert_args(runner_.spec(), runner_.dispatch_result(), runner_.expert_target());
  if (runner_.session().on_gpu()) {
    TOOL_CHECK_CUDA(launch_stand_in_expert(args, static_cast<cudaStream_t>(stream)));
  } else {
    run_stand_in_expert_host(args);
  }
}

void DecodeStep::launch_expert(void* stream) {
  if (graph_) {
    expert_graph_->launch(stream);
  } else {
    expert(stream);
  }
}

void DecodeStep::launch_step(void* stream) {
  if (graph_) {
    step_graph_->launch(stream);
    return;
  }
  TOOL_CHECK_MOE(runner_.dispatch(stream));
  expert(stream);
  TOOL_CHECK_MOE(runner_.combine(stream));
}

void DecodeStep::launch_split_step(void* stream) {
  if (graph_) {
    split_graph_->launch(stream);
  } else {
    TOOL_CHECK_MOE(split_step(stream));
  }
}

// The expert reads the result of dispatch_recv and writes where combine_send reads.
moe_ep_status_t DecodeStep::split_step(void* stream) {
  moe_ep_status_t status = runner_.half(MoeEpRunner::kDispatchSend, stream);
  if (status == MOE_EP_SUCCESS) status = runner_.half(MoeEpRunner::kDispatchRecv, stream);
  if (status != MOE_EP_SUCCESS) return status;
  expert(stream);
  status = runner_.half(MoeEpRunner::kCombineSend, stream);
  return status == MOE_EP_SUCCESS ? runner_.half(MoeEpRunner::kCombineRecv, stream) : status;
}

void DecodeStep::capture_parts() {
  runner_.prepare(graph_);  // the dispatch and combine graphs
  if (!graph_) return;
  // Captured after dispatch: its arguments are that capture's result views,
  // which every replay of the dispatch graph refills.
  expert_graph_ = std::make_unique<CapturedCall>(runner_.session().stream(), [&](void* st) {
    expert(st);
    return MOE_EP_SUCCESS;
  });
}

void DecodeStep::capture_step(bool split) {
  if (!graph_) return;
  if (split) {
    split_graph_ = std::make_unique<CapturedCall>(runner_.session().stream(), [&](void* st) { return split_step(st); });
    return;
  }
  step_graph_ = std::make_unique<CapturedCall>(runner_.session().stream(), [&](void* st) {
    const moe_ep_status_t dispatched = runner_.dispatch(st);
    if (dispatched != MOE_EP_SUCCESS) return dispatched;
    expert(st);
    return runner_.combine(st);
  });
}

void DecodeStep::check_parts(DecodeStepResult& r) {
  const Session& s = runner_.session();
  runner_.launch_dispatch(graph_, s.stream());
  Verdict d = runner_.verify_dispatch();
  if (grouped_) {  // the group sizes the GEMMs take are the counts dispatch returned
    d.add(grouped_->count_mismatches(runner_.dispatch_result(), static_cast<cudaStream_t>(s.stream())),
          "grouped expert: group sizes differ from expert_counts");
  }
  launch_expert(s.stream());
  runner_.launch_combine(graph_, s.stream());
  const ExpertRowModel model = stand_in_expert_model(runner_.spec(), s.world().rank);
  const Verdict c = runner_.verify_combine(grouped_ ? nullptr : &model);
  if (s.world().is_root() && (d.wrong || c.wrong)) {
    std::fprintf(stderr, "decode step parts, %d tokens:\n%s%s", r.tokens, d.details.c_str(), c.details.c_str());
  }
  r.wrong_dispatch = s.world().sum(d.wrong);
  r.wrong_parts = s.world().sum(c.wrong);
}

// New inputs, so that an output or expert rows left over from the parts
// cannot pass for the step's.
int64_t DecodeStep::check_step(const WorkloadSpec& fresh, const std::vector<RankRouting>& fresh_all, bool split,
                               int tokens) {
  const Session& s = runner_.session();
  runner_.load(fresh, fresh_all);
  if (split) {
    launch_split_step(s.stream());
  } else {
    launch_step(s.stream());
  }
  const ExpertRowModel model = stand_in_expert_model(fresh, s.world().rank);
  Verdict c = runner_.verify_combine(grouped_ ? nullptr : &model);
  c.merge(runner_.verify_async());
  if (s.world().is_root() && c.wrong) {
    std::fprintf(stderr, "decode step%s, %d tokens:\n%s", split ? " (split)" : "", tokens, c.details.c_str());
  }
  return s.world().sum(c.wrong);
}

}  // namespace moe_ep_tool
