// bench --decode-step: one decode step of an inference server, dispatch ->
// the stand-in expert (stand_in_expert.hpp) -> combine, captured in one CUDA
// graph with -G, timed per replay next to its parts: dispatch, the stand-in
// and combine, each a replay of its own graph, in the same loop.  The step
// and the parts are checked against the oracle with the stand-in modelled.
// Without -G (and on the HOST backend) the same calls run eagerly.
#pragma once

#include <memory>
#include <vector>

#include "moe_ep_runner.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

struct DecodeStepResult {
  int tokens = 0;
  Traffic traffic;
  // Wrong elements (-1: not checked): dispatch's result, combine's output
  // after the three parts, and combine's output after the whole step (on new
  // inputs, so that a part the step left out shows).
  int64_t wrong_dispatch = -1, wrong_parts = -1, wrong_step = -1;
  PhaseTiming dispatch, expert, combine;
  PhaseTiming parts;  // dispatch + expert + combine, added per iteration on each rank
  PhaseTiming step;   // the whole step
  bool gate_expired = false;
};

class DecodeStep {
 public:
  DecodeStep(MoeEpRunner& runner, bool graph) : runner_(runner), graph_(graph) {}

  // One size: `w` and every rank's routing `all` are timed (and checked with
  // `check`); `fresh` is the same size with other inputs, for the step's check.
  // Collective.
  DecodeStepResult measure(const WorkloadSpec& w, const std::vector<RankRouting>& all, const WorkloadSpec& fresh,
                           const std::vector<RankRouting>& fresh_all, bool check, const LoopOptions& loop);

 private:
  void expert(void* stream);         // the stand-in on the last dispatch's result, eagerly
  void launch_expert(void* stream);  // the expert part: a replay of its graph, or eager
  void launch_step(void* stream);    // the whole step: a replay of its graph, or three eager calls
  void capture_parts();
  void capture_step();
  void check_parts(DecodeStepResult& r);
  void check_step(const WorkloadSpec& fresh, const std::vector<RankRouting>& fresh_all, DecodeStepResult& r);

  MoeEpRunner& runner_;
  bool graph_;
  std::unique_ptr<CapturedCall> expert_graph_, step_graph_;
};

}  // namespace moe_ep_tool
