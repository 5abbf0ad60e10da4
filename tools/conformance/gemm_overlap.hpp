// bench --overlap-gemm: dispatch and combine beside a GEMM, as a server runs
// them (the expert GEMMs of one micro-batch while another's tokens move).
// Each iteration times, on the same GPU clock: the GEMM alone, dispatch and
// combine alone, then both started together, each on its own stream, and the
// wall time of the pair.  The all-to-all runs on a stream of the greatest
// priority with config.num_sms SMs (--num-sms), the GEMM on a stream of the
// least priority, told to use the device's other SMs.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "blas_gemm.hpp"
#include "moe_ep_runner.hpp"
#include "side_streams.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

struct OverlapResult {
  int tokens = 0;
  Traffic traffic;
  int64_t wrong_dispatch = -1, wrong_combine = -1;  // the bench's check of the pair, -1: not checked
  GemmShape gemm;
  int gemm_sm_target = 0;                                             // cublasSetSmCountTarget, 0 = all SMs
  bool gemm_auto_shape = false;                                       // M chosen to match dispatch + combine alone
  PhaseTiming gemm_alone, dispatch_alone, combine_alone, pair_alone;  // pair = dispatch + combine
  PhaseTiming gemm_beside, dispatch_beside, combine_beside, pair_beside;
  PhaseTiming wall;  // from the common start until both are done
  bool gate_expired = false;
};

// Why this run cannot run the cuBLAS GEMM of the mode `flag` ("" = it can):
// it needs a GPU backend and a tool built with cuBLAS.
std::string overlap_refusal(const Session& session, const std::string& flag = "--overlap-gemm");

// cublasSetSmCountTarget for a GEMM beside the all-to-all: the device's SMs
// minus --num-sms, or 0 (all SMs) when --num-sms is 0.
int gemm_sm_target(const Session& session);

class GemmOverlap {
 public:
  // mnk: M,N,K of the GEMM, or empty: N = K = 8192 and M chosen at each size
  // so that the GEMM alone takes about as long as dispatch + combine alone.
  GemmOverlap(const Session& session, const std::vector<int>& mnk);

  // The loaded size: checked (when check) and timed.  Collective.
  OverlapResult measure(MoeEpRunner& runner, bool graph, bool check, const LoopOptions& loop);

  int sm_target() const { return sm_target_; }  // cublasSetSmCountTarget, 0 = all SMs
  bool auto_shape() const { return fixed_.m == 0; }

 private:
  GemmShape shape_for(MoeEpRunner& runner, bool graph, const LoopOptions& loop);

  const Session& s_;
  GemmShape fixed_;
  int sm_target_ = 0;
  SideStreams streams_;
};

}  // namespace moe_ep_tool
