#include "moe_ep_runner.hpp"

#include <cstdio>

#include "errors.hpp"
#include "expert_rows.hpp"

namespace moe_ep_tool {

MicroBatch::MicroBatch(const Session& s, const WorkloadSpec& largest, bool zero_copy)
    : s_(s),
      zero_copy_(zero_copy),
      inputs_(largest, s.place()),
      expert_output_(s.place(), uint64_t(largest.combine_rows()) * largest.combine_row_bytes()) {}

void MicroBatch::load(const WorkloadSpec& w, const std::vector<RankRouting>& all) {
  spec_ = w;
  all_ = &all;
  inputs_.load(w, me(), all[me()], s_.stream());
  if (w.expert_layout()) {  // the pair rows only (expert_rows.hpp)
    write_expert_layout_output(w, me(), all, s_.place(), expert_output_.data(), s_.stream());
  } else {
    expert_output_.upload(make_expert_output(w, me()), s_.stream());
  }
}

moe_ep_status_t MicroBatch::dispatch(moe_ep_handle_t h, void* stream) {
  return inputs_.dispatch(h, spec_, &dr_, stream);
}

moe_ep_status_t MicroBatch::combine(moe_ep_handle_t h, void* stream) {
  return run_combine(h, spec_, s_.place(), expert_target(), false, nullptr, inputs_.num_tokens(), &cr_, stream);
}

moe_ep_status_t MicroBatch::dispatch_send(moe_ep_handle_t h, int32_t slot, void* stream) {
  return inputs_.dispatch_send(h, slot, spec_, stream);
}

moe_ep_status_t MicroBatch::dispatch_recv(moe_ep_handle_t h, int32_t slot, void* stream) {
  TOOL_CHECK_MOE(moe_ep_dispatch_result_init(&dr_, sizeof dr_));
  return moe_ep_dispatch_recv(h, slot, &dr_, stream);
}

moe_ep_status_t MicroBatch::combine_send(moe_ep_handle_t h, int32_t slot, void* stream) {
  return run_combine_send(h, slot, spec_, s_.place(), expert_target(), false, stream);
}

moe_ep_status_t MicroBatch::combine_recv(moe_ep_handle_t h, int32_t slot, void* stream) {
  return run_combine_recv(h, slot, spec_, s_.place(), nullptr, inputs_.num_tokens(), &cr_, stream);
}

void* MicroBatch::expert_target() const { return zero_copy_ ? dr_.combine_input.data : expert_output_.data(); }

Verdict MicroBatch::verify_dispatch() {
  if (spec_.expert_layout()) return check_expert_layout_dispatch(spec_, *all_, me(), dr_, s_.place(), s_.stream());
  Verdict d;
  const ReceivedDispatch got = read_dispatch(spec_, dr_, s_.place().dlpack(), reader(s_.place(), s_.stream()), d);
  d.merge(check_dispatch(spec_, *all_, me(), got));
  return d;
}

Verdict MicroBatch::verify_combine(const ExpertRowModel* model) {
  Verdict c;
  const std::vector<uint8_t> out =
      read_combine(spec_, cr_, inputs_.num_tokens(), s_.place().dlpack(), reader(s_.place(), s_.stream()), c);
  if (inputs_.num_tokens() > 0) {
    c.merge(model ? check_combine(spec_, *all_, me(), out, *model) : check_combine(spec_, *all_, me(), out));
  }
  return c;
}

Verdict verify_async(moe_ep_handle_t handle) {
  Verdict v;
  moe_ep_status_t async = MOE_EP_SUCCESS;
  TOOL_CHECK_MOE(moe_ep_get_async_error(handle, &async));
  v.add(async != MOE_EP_SUCCESS ? 1 : 0, std::string("async error: ") + moe_ep_status_string(async));
  return v;
}

std::string split_refusal(const Session& s, moe_ep_status_t status) {
  if (status == MOE_EP_ERROR_UNSUPPORTED) {
    return "backend " + s.backend_name() + " has no split phases: " + moe_ep_last_error();
  }
  TOOL_CHECK_MOE(status);
  return "";
}

MoeEpRunner::MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy)
    : s_(s),
      zero_copy_(zero_copy),
      handle_(s.bootstrap(), largest.params(), with_zero_copy_combine(s.config(), zero_copy)),
      batch_(s, largest, zero_copy) {}

MoeEpRunner::MoeEpRunner(const Session& s, const WorkloadSpec& largest, bool zero_copy, moe_ep_status_t tolerated,
                         moe_ep_status_t* status)
    : s_(s),
      zero_copy_(zero_copy),
      handle_(s.bootstrap(), largest.params(), with_zero_copy_combine(s.config(), zero_copy), tolerated, status),
      batch_(s, largest, zero_copy) {}

void MoeEpRunner::load(const WorkloadSpec& w, const std::vector<RankRouting>& all) {
  batch_.load(w, all);
  view_loaded_ = false;
}

std::pair<int64_t, int64_t> MoeEpRunner::check_with(const std::function<void()>& dispatch,
                                                    const std::function<void()>& combine) {
  dispatch();
  Verdict d = verify_dispatch();
  combine();
  const Verdict c = verify_combine();
  d.merge(verify_async());
  if (s_.world().is_root() && (d.wrong || c.wrong)) std::fprintf(stderr, "%s%s", d.details.c_str(), c.details.c_str());
  return {d.wrong, c.wrong};
}

std::pair<int64_t, int64_t> MoeEpRunner::check(bool graph) {
  prepare(graph);
  return check_with([&] { launch_dispatch(graph, s_.stream()); }, [&] { launch_combine(graph, s_.stream()); });
}

std::pair<int64_t, int64_t> MoeEpRunner::check_split(bool graph) {
  prepare(graph, true);
  return check_with(
      [&] {
        launch_half(kDispatchSend, graph, s_.stream());
        launch_half(kDispatchRecv, graph, s_.stream());
      },
      [&] {
        launch_half(kCombineSend, graph, s_.stream());
        launch_half(kCombineRecv, graph, s_.stream());
      });
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

void MoeEpRunner::prepare(bool graph, bool split) {
  load_view();
  if (!graph) return;
  if (!dispatch_graph_) {
    dispatch_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return dispatch(st); });
    combine_graph_ = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return combine(st); });
  }
  if (split && !half_graphs_[0]) {  // in the order of the state machine: each capture moves slot 0 on
    for (int h = 0; h < kHalves; ++h) {
      half_graphs_[h] = std::make_unique<CapturedCall>(s_.stream(), [&](void* st) { return half(Half(h), st); });
    }
  }
}

void MoeEpRunner::drop_graphs() {
  dispatch_graph_.reset();
  combine_graph_.reset();
  for (auto& g : half_graphs_) g.reset();
}

std::string MoeEpRunner::probe_split() {
  const std::string refusal = split_refusal(s_, half(kDispatchSend, s_.stream()));
  if (!refusal.empty()) return refusal;
  for (Half h : {kDispatchRecv, kCombineSend, kCombineRecv}) TOOL_CHECK_MOE(half(h, s_.stream()));
  return "";
}

moe_ep_status_t MoeEpRunner::half(Half half, void* stream) {
  switch (half) {
    case kDispatchSend: return batch_.dispatch_send(handle(), 0, stream);
    case kDispatchRecv: return batch_.dispatch_recv(handle(), 0, stream);
    case kCombineSend: return batch_.combine_send(handle(), 0, stream);
    default: return batch_.combine_recv(handle(), 0, stream);
  }
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

void MoeEpRunner::launch_half(Half h, bool graph, void* stream) {
  if (graph) {
    half_graphs_[h]->launch(stream);
  } else {
    TOOL_CHECK_MOE(half(h, stream));
  }
}

// --zero-copy-combine: one untimed pair writes this size's expert output into
// the combine_input view; the timed pairs then combine from it.  This relies
// on dispatch leaving the view's contents alone (true of every backend), and
// check() would count a backend that did not as #wrong.
void MoeEpRunner::load_view() {
  if (!zero_copy_ || view_loaded_) return;
  TOOL_CHECK_MOE(dispatch(s_.stream()));
  fill_combine_input(spec(), s_.world().rank, s_.place(), dispatch_result(), s_.stream(), &batch_.routing());
  TOOL_CHECK_MOE(combine(s_.stream()));
  view_loaded_ = true;
}

}  // namespace moe_ep_tool
