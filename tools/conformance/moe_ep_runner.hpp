// moe_ep at one size of the benchmark: one handle sized for the largest size,
// one rank's inputs, the dispatch and combine calls (eager, or captured once
// and replayed), the check of their results against the oracle, and the
// timed loop of the plain sweep.  The decode step and the overlap
// measurement build on its calls.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "ep_calls.hpp"
#include "graph_capture.hpp"
#include "loop_timer.hpp"
#include "session.hpp"

namespace moe_ep_tool {

class MoeEpRunner {
 public:
  MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy);

  // This size's inputs (and the expert output combine takes), for every rank's routing `all`.
  void load(const WorkloadSpec& w, const std::vector<RankRouting>& all);

  // The sweep: eager calls (or replays of the captured graphs) checked once:
  // (dispatch, combine) wrong.
  std::pair<int64_t, int64_t> check(bool graph);
  // The sweep's timed loop: phase 0 dispatch, phase 1 combine.
  LoopResult time(const LoopOptions& o, bool graph);

  // --zero-copy-combine writes this size's expert output into the view, and
  // `graph` captures dispatch and combine (once per load).
  void prepare(bool graph);
  void drop_graphs();

  // One call on `stream`: a replay of the captured graph, or an eager call.
  void launch_dispatch(bool graph, void* stream);
  void launch_combine(bool graph, void* stream);
  // Eager calls: what a capture records.
  moe_ep_status_t dispatch(void* stream);
  moe_ep_status_t combine(void* stream);  // combine takes expert_target()

  // The last dispatch's (or capture's) result, read back and checked now.
  Verdict verify_dispatch();
  // The last combine's output, checked for the expert rows `model` (default:
  // make_expert_output's, what load() gives combine).
  Verdict verify_combine(const ExpertRowModel* model = nullptr);
  // An asynchronous error of the handle (moe_ep_get_async_error): one wrong element.
  Verdict verify_async();

  const moe_ep_dispatch_result_t& dispatch_result() const { return dr_; }
  // Where combine reads the expert output: the dispatch result's combine_input
  // view (--zero-copy-combine), else the tool's buffer.
  void* expert_target() const;
  const WorkloadSpec& spec() const { return spec_; }
  const Session& session() const { return s_; }
  moe_ep_handle_t handle() const { return handle_.get(); }

 private:
  int me() const { return s_.world().rank; }
  void load_view();

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

}  // namespace moe_ep_tool
