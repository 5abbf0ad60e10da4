// moe_ep at one size of the benchmark: one handle sized for the largest size,
// one rank's inputs, the dispatch and combine calls (eager, or captured once
// and replayed), the check of their results against the oracle, and the
// timed loop of the plain sweep.  The decode step and the overlap
// measurements build on its calls; a MicroBatch is one micro-batch's inputs,
// results and checks, on any handle and buffer slot.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ep_calls.hpp"
#include "graph_capture.hpp"
#include "loop_timer.hpp"
#include "session.hpp"

namespace moe_ep_tool {

// One micro-batch: this rank's dispatch inputs and expert output for one
// workload, the last dispatch and combine results, and their checks.  The
// calls name the handle and, for the halves, the buffer slot.
class MicroBatch {
 public:
  MicroBatch(const Session& s, const WorkloadSpec& largest, bool zero_copy);

  // This workload's inputs (and the expert output combine takes), for every rank's routing `all`.
  void load(const WorkloadSpec& w, const std::vector<RankRouting>& all);

  // The fused calls (slot 0) and the halves on `slot`; combine takes
  // expert_target() and returns library-owned memory.
  moe_ep_status_t dispatch(moe_ep_handle_t h, void* stream);
  moe_ep_status_t combine(moe_ep_handle_t h, void* stream);
  moe_ep_status_t dispatch_send(moe_ep_handle_t h, int32_t slot, void* stream);
  moe_ep_status_t dispatch_recv(moe_ep_handle_t h, int32_t slot, void* stream);
  moe_ep_status_t combine_send(moe_ep_handle_t h, int32_t slot, void* stream);
  moe_ep_status_t combine_recv(moe_ep_handle_t h, int32_t slot, void* stream);

  // The last dispatch's (or capture's) result, read back and checked now (an
  // expert layout's on its pair rows: expert_rows.hpp).
  Verdict verify_dispatch();
  // The last combine's output, checked for the expert rows `model` (default:
  // make_expert_output's, what load() gives combine).
  Verdict verify_combine(const ExpertRowModel* model = nullptr);

  const moe_ep_dispatch_result_t& dispatch_result() const { return dr_; }
  // Where combine reads the expert output: the dispatch result's combine_input
  // view (zero-copy), else the tool's buffer.
  void* expert_target() const;
  const WorkloadSpec& spec() const { return spec_; }
  const std::vector<RankRouting>& routing() const { return *all_; }
  const DispatchInputs& inputs() const { return inputs_; }

 private:
  int me() const { return s_.world().rank; }

  const Session& s_;
  bool zero_copy_ = false;
  DispatchInputs inputs_;
  Buffer expert_output_;
  WorkloadSpec spec_;
  const std::vector<RankRouting>* all_ = nullptr;
  moe_ep_dispatch_result_t dr_{};
  moe_ep_combine_result_t cr_{};
};

// An asynchronous error of `handle` (moe_ep_get_async_error): one wrong element.
Verdict verify_async(moe_ep_handle_t handle);

// Why `handle` cannot run the split halves ("" = it can): `status` from the
// first half it was asked for, MOE_EP_ERROR_UNSUPPORTED with the library's
// message, naming the backend.  Any other failure is a tool error.
std::string split_refusal(const Session& s, moe_ep_status_t status);

class MoeEpRunner {
 public:
  MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy);
  // As above, except that create's answer `tolerated` is not a tool error:
  // handle() is then NULL and *status says so (the message is moe_ep_last_error()).
  MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy, moe_ep_status_t tolerated,
              moe_ep_status_t* status);

  // This size's inputs (and the expert output combine takes), for every rank's routing `all`.
  void load(const WorkloadSpec& w, const std::vector<RankRouting>& all);

  // The sweep: eager calls (or replays of the captured graphs) checked once:
  // (dispatch, combine) wrong.
  std::pair<int64_t, int64_t> check(bool graph);
  // The same through the halves (slot 0): dispatch_send + dispatch_recv, combine_send + combine_recv.
  std::pair<int64_t, int64_t> check_split(bool graph);
  // The sweep's timed loop: phase 0 dispatch, phase 1 combine.
  LoopResult time(const LoopOptions& o, bool graph);

  // --zero-copy-combine writes this size's expert output into the view, and
  // `graph` captures dispatch and combine (once per load), and with `split`
  // each half on its own too.
  void prepare(bool graph, bool split = false);
  void drop_graphs();

  // Whether the handle has the halves ("" = it has; else why not, naming the
  // backend): one untimed split pair on the loaded inputs.  Collective.
  std::string probe_split();

  // One call on `stream`: a replay of the captured graph, or an eager call.
  void launch_dispatch(bool graph, void* stream);
  void launch_combine(bool graph, void* stream);
  // The halves on slot 0, likewise (graphs from prepare(graph, true)).
  enum Half : int { kDispatchSend, kDispatchRecv, kCombineSend, kCombineRecv, kHalves };
  void launch_half(Half half, bool graph, void* stream);
  // Eager calls: what a capture records.
  moe_ep_status_t dispatch(void* stream) { return batch_.dispatch(handle(), stream); }
  moe_ep_status_t combine(void* stream) { return batch_.combine(handle(), stream); }  // takes expert_target()
  moe_ep_status_t half(Half half, void* stream);

  Verdict verify_dispatch() { return batch_.verify_dispatch(); }
  Verdict verify_combine(const ExpertRowModel* model = nullptr) { return batch_.verify_combine(model); }
  Verdict verify_async() { return moe_ep_tool::verify_async(handle()); }

  const moe_ep_dispatch_result_t& dispatch_result() const { return batch_.dispatch_result(); }
  void* expert_target() const { return batch_.expert_target(); }
  const WorkloadSpec& spec() const { return batch_.spec(); }
  const DispatchInputs& inputs() const { return batch_.inputs(); }
  const Session& session() const { return s_; }
  moe_ep_handle_t handle() const { return handle_.get(); }

 private:
  std::pair<int64_t, int64_t> check_with(const std::function<void()>& dispatch, const std::function<void()>& combine);
  void load_view();

  const Session& s_;
  bool zero_copy_ = false;
  bool view_loaded_ = false;
  EpHandle handle_;
  MicroBatch batch_;
  std::unique_ptr<CapturedCall> dispatch_graph_, combine_graph_;
  std::unique_ptr<CapturedCall> half_graphs_[kHalves];
};

}  // namespace moe_ep_tool
