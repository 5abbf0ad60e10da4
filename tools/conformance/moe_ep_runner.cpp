#include "moe_ep_runner.hpp"

#include <cstdio>

#include "errors.hpp"

namespace moe_ep_tool {

MoeEpRunner::MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy)
    : s_(s),
      zero_copy_(zero_copy),
      handle_(s.bootstrap(), largest.params(), with_zero_copy_combine(s.config(), zero_copy)),
      inputs_(largest, s.place()),
      expert_output_(s.place(), uint64_t(largest.receive_rows()) * largest.combine_row_bytes()) {}

void MoeEpRunner::load(const WorkloadSpec& w, const std::vector<RankRouting>& all) {
  spec_ = w;
  all_ = &all;
  inputs_.load(w, me(), all[me()], s_.stream());
  expert_output_.upload(make_expert_output(w, me()), s_.stream());
  view_loaded_ = false;
}

std::pair<int64_t, int64_t> MoeEpRunner::check(bool graph) {
  prepare(graph);
  launch_dispatch(graph, s_.stream());
  Verdict d = verify_dispatch();
  launch_combine(graph, s_.stream());
  const Verdict c = verify_combine();
  d.merge(verify_async());
  if (s_.world().is_root() && (d.wrong || c.wrong)) std::fprintf(stderr, "%s%s", d.details.c_str(), c.details.c_str());
  return {d.wrong, c.wrong};
}

LoopResult MoeEpRunner::time(const LoopOptions& o, bool graph) {
  prepare(graph);
  return time_loop(s_, o, 2, [&](Marks& m) {
    m.mark();
    launch_dispatch(graph, s_.stream());
    m.mark();
    launch_combine(graph, s_.stream());
    m.mark();
  });
}

void MoeEpRunner::prepare(bool graph) {
  load_view();
  if (!graph || dispatch_graph_) return;
  dispatch_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return dispatch(st); });
  combine_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return combine(st); });
}

void MoeEpRunner::drop_graphs() {
  dispatch_graph_.reset();
  combine_graph_.reset();
}

void MoeEpRunner::launch_dispatch(bool graph, void* stream) {
  if (graph) {
    dispatch_graph_->launch(stream);
  } else {
    TOOL_CHECK_MOE(dispatch(stream));
  }
}

void MoeEpRunner::launch_combine(bool graph, void* stream) {
  if (graph) {
    combine_graph_->launch(stream);
  } else {
    TOOL_CHECK_MOE(combine(stream));
  }
}

moe_ep_status_t MoeEpRunner::dispatch(void* stream) { return inputs_.dispatch(handle_.get(), spec_, &dr_, stream); }

moe_ep_status_t MoeEpRunner::combine(void* stream) {
  return run_combine(handle_.get(), spec_, s_.place(), expert_target(), false, nullptr, inputs_.num_tokens(), &cr_,
                     stream);
}

void* MoeEpRunner::expert_target() const { return zero_copy_ ? dr_.combine_input.data : expert_output_.data(); }

Verdict MoeEpRunner::verify_dispatch() {
  Verdict d;
  const ReceivedDispatch got = read_dispatch(spec_, dr_, s_.place().dlpack(), reader(s_.place(), s_.stream()), d);
  d.merge(check_dispatch(spec_, *all_, me(), got));
  return d;
}

Verdict MoeEpRunner::verify_combine(const ExpertRowModel* model) {
  Verdict c;
  const std::vector<uint8_t> out =
      read_combine(spec_, cr_, inputs_.num_tokens(), s_.place().dlpack(), reader(s_.place(), s_.stream()), c);
  if (inputs_.num_tokens() > 0) {
    c.merge(model ? check_combine(spec_, *all_, me(), out, *model) : check_combine(spec_, *all_, me(), out));
  }
  return c;
}

Verdict MoeEpRunner::verify_async() {
  Verdict v;
  moe_ep_status_t async = MOE_EP_SUCCESS;
  TOOL_CHECK_MOE(moe_ep_get_async_error(handle_.get(), &async));
  v.add(async != MOE_EP_SUCCESS ? 1 : 0, std::string("async error: ") + moe_ep_status_string(async));
  return v;
}

// --zero-copy-combine: one untimed pair writes this size's expert output into
// the combine_input view; the timed pairs then combine from it.  This relies
// on dispatch leaving the view's contents alone (true of every backend), and
// check() would count a backend that did not as #wrong.
void MoeEpRunner::load_view() {
  if (!zero_copy_ || view_loaded_) return;
  TOOL_CHECK_MOE(dispatch(s_.stream()));
  fill_combine_input(spec_, me(), s_.place(), dr_, s_.stream());
  TOOL_CHECK_MOE(combine(s_.stream()));
  view_loaded_ = true;
}

}  // namespace moe_ep_tool
