// Runs one workload through a GPU backend's handle and a HOST handle over
// the same bootstrap, on fresh random inputs every round, with the GPU results
// poisoned before each round, and compares every output byte for byte
// (moe_ep_verify's comparison; the HOST backend is checked against the oracle
// by the CPU suites and by moe_ep_conformance).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_test {

using moe_ep_verify::RankInputs;
using moe_ep_verify::WorkloadSpec;

// The GPU backend a suite tests: MOE_EP_TEST_GPU_BACKEND=nccl selects
// MOE_EP_BACKEND_NCCL, anything else (or unset) NVLINK_TWO_SIDED.
int32_t gpu_backend_under_test();

struct GpuCaseOptions {
  int32_t backend = gpu_backend_under_test();  // compared with the HOST backend
  int rounds = 3;              // dispatch/combine pairs, each on new inputs
  bool caller_output = false;  // combine into the caller's buffer (else library-owned)
  bool graph = false;          // capture dispatch+combine once, replay it every round
  bool zero_copy_combine = false;  // GPU handle with config.zero_copy_combine: the expert output is
                                   // written into the dispatch result's combine_input view, which
                                   // combine then takes (eager rounds only; the HOST oracle takes a copy)
  // With zero_copy_combine: the ranks and rounds for which this returns false
  // pass their own expert_output buffer instead of the view (combine then
  // copies it into the view for the peers); their view is poisoned after the
  // dispatch, so a missed copy shows.  Empty: every rank passes the view.
  std::function<bool(int rank, int round)> zero_copy_passes_view;
  int timeout_ms = 20000;
  int num_sms = 0;
  int device = -1;             // -1 = gpu_device()
  // Edits a rank's inputs after they are drawn (both handles see the edit).
  std::function<void(int rank, RankInputs& inputs)> edit_inputs;
  // Edits a rank's expert output ([P, H] combine_dtype) after it is drawn
  // (both handles see the edit): special values, say.
  std::function<void(int rank, int round, std::vector<uint8_t>& expert_output)> edit_expert_output;
  // Combine outputs compared bit for bit except that any two NaNs of
  // combine_dtype are equal: a sum with a NaN is the hardware's NaN (the GPU's
  // canonical one, the host CPU's quieted operand), not a value the API fixes.
  bool nans_compare_equal = false;
  // Called (eager rounds only) after the GPU dispatch is issued and before its
  // combine: e.g. to run a second handle while this one has a dispatch in flight.
  std::function<void()> between_dispatch_and_combine;
};

// Collective over `bootstrap`.  Returns "" when every round matched on this
// rank, else a description of the first differences.
std::string run_gpu_case(const WorkloadSpec& spec, const moe_ep_bootstrap_t& bootstrap, const GpuCaseOptions& options);

}  // namespace moe_ep_test
