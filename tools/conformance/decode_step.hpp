// bench --decode-step: one decode step of an inference server, dispatch ->
// the stand-in expert (stand_in_expert.hpp) -> combine, captured in one CUDA
// graph with -G, timed per replay next to its parts: dispatch, the stand-in
// and combine, each a replay of its own graph, in the same loop.  Where the
// backend has the split halves, the same step through them (dispatch_send;
// dispatch_recv; the stand-in; combine_send; combine_recv on slot 0 of the
// same handle) is a second graph in that loop.  The steps and the parts are
// checked against the oracle with the stand-in modelled.  --expert-gemm
// grouped puts the grouped-GEMM expert (grouped_expert.hpp) in the stand-in's
// place, on EXPERT_PACKED rows.  Without -G (and on
// the HOST backend) the same calls run eagerly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grouped_expert.hpp"
#include "moe_ep_runner.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

struct DecodeStepResult {
  int tokens = 0;
  Traffic traffic;
  // Wrong elements (-1: not checked): dispatch's result, combine's output
  // after the three parts, and combine's output after the whole step (on new
  // inputs, so that a part the step left out shows), and after the split step.
  int64_t wrong_dispatch = -1, wrong_parts = -1, wrong_step = -1, wrong_split_step = -1;
  PhaseTiming dispatch, expert, combine;
  PhaseTiming parts;  // dispatch + expert + combine, added per iteration on each rank
  PhaseTiming step;   // the whole step
  bool has_split = false;
  PhaseTiming split_step;  // the whole step through the halves
  bool gate_expired = false;
  // The grouped-GEMM expert: its groups (local experts with rows) and the
  // bytes of their weights, which every expert call reads.
  int expert_groups = 0;
  uint64_t expert_weight_bytes = 0;
};

class DecodeStep {
 public:
  // grouped: the grouped-GEMM expert on the runner's EXPERT_PACKED rows in
  // place of the stand-in (NULL: the stand-in); combine then takes the
  // tool's expert output, and the checks compare with the oracle's rows.
  DecodeStep(MoeEpRunner& runner, bool graph, GroupedExpert* grouped = nullptr)
      : runner_(runner), graph_(graph), grouped_(grouped) {}

  // Why the split step is not measured ("" = it is): asked once, at the first
  // size, from the library's answer to the first half.  Collective.
  const std::string& split_refusal() const { return split_refusal_; }

  // One size: `w` and every rank's routing `all` are timed (and checked with
  // `check`); `fresh` is the same size with other inputs, for the step's check.
  // Collective.
  DecodeStepResult measure(const WorkloadSpec& w, const std::vector<RankRouting>& all, const WorkloadSpec& fresh,
                           const std::vector<RankRouting>& fresh_all, bool check, const LoopOptions& loop);

 private:
  void expert(void* stream);         // the stand-in on the last dispatch's result, eagerly
  void launch_expert(void* stream);  // the expert part: a replay of its graph, or eager
  void launch_step(void* stream);    // the whole step: a replay of its graph, or three eager calls
  void launch_split_step(void* stream);      // the same through the halves
  moe_ep_status_t split_step(void* stream);  // eager: what its capture records
  void capture_parts();
  void capture_step(bool split);
  void check_parts(DecodeStepResult& r);
  // The step (split or not) on new inputs; its #wrong.
  int64_t check_step(const WorkloadSpec& fresh, const std::vector<RankRouting>& fresh_all, bool split, int tokens);

  MoeEpRunner& runner_;
  bool graph_;
  GroupedExpert* grouped_;
  bool asked_split_ = false;
  std::string split_refusal_;
  std::unique_ptr<CapturedCall> expert_graph_, step_graph_, split_graph_;
};

}  // namespace moe_ep_tool
