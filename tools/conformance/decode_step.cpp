#include "decode_step.hpp"

#include <cstdio>

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
  capture_parts();
  if (check) check_parts(r);
  // The step is captured after the parts are checked: its capture replaces
  // the runner's dispatch and combine results with its own.
  capture_step();
  if (check) {
    check_step(fresh, fresh_all, r);
    runner_.load(w, all);
  }
  const LoopResult t = time_loop(s, loop, 4, [&](Marks& m) {
    m.mark();
    runner_.launch_dispatch(graph_, s.stream());
    m.mark();
    launch_expert(s.stream());
    m.mark();
    runner_.launch_combine(graph_, s.stream());
    m.mark();
    launch_step(s.stream());
    m.mark();
  });
  runner_.drop_graphs();
  expert_graph_.reset();
  step_graph_.reset();
  const World& world = s.world();
  r.dispatch = reduce_phase(world, t.phase_us[0]);
  r.expert = reduce_phase(world, t.phase_us[1]);
  r.combine = reduce_phase(world, t.phase_us[2]);
  r.step = reduce_phase(world, t.phase_us[3]);
  r.parts = reduce_phase(world, sum_each(sum_each(t.phase_us[0], t.phase_us[1]), t.phase_us[2]));
  r.gate_expired = t.gate_expired;
  return r;
}

void DecodeStep::expert(void* stream) {
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

void DecodeStep::capture_step() {
  if (!graph_) return;
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
  const Verdict d = runner_.verify_dispatch();
  launch_expert(s.stream());
  runner_.launch_combine(graph_, s.stream());
  const ExpertRowModel model = stand_in_expert_model(runner_.spec(), s.world().rank);
  const Verdict c = runner_.verify_combine(&model);
  if (s.world().is_root() && (d.wrong || c.wrong)) {
    std::fprintf(stderr, "decode step parts, %d tokens:\n%s%s", r.tokens, d.details.c_str(), c.details.c_str());
  }
  r.wrong_dispatch = s.world().sum(d.wrong);
  r.wrong_parts = s.world().sum(c.wrong);
}

// New inputs, so that an output or expert rows left over from the parts
// cannot pass for the step's.
void DecodeStep::check_step(const WorkloadSpec& fresh, const std::vector<RankRouting>& fresh_all, DecodeStepResult& r) {
  const Session& s = runner_.session();
  runner_.load(fresh, fresh_all);
  launch_step(s.stream());
  const ExpertRowModel model = stand_in_expert_model(fresh, s.world().rank);
  Verdict c = runner_.verify_combine(&model);
  c.merge(runner_.verify_async());
  if (s.world().is_root() && c.wrong) std::fprintf(stderr, "decode step, %d tokens:\n%s", r.tokens, c.details.c_str());
  r.wrong_step = s.world().sum(c.wrong);
}

}  // namespace moe_ep_tool
