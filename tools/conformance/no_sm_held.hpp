// bench --no-sm-held: whether the split halves leave every SM to other work
// while they are in flight.  A GEMM that fills every SM (cuBLAS, all SMs,
// many waves) runs on the compute stream between a send half and its receive
// half, each on the communication stream (side_streams.hpp): the GEMM starts
// when the send half's work is done, and the receive half is queued right
// behind the send half, so it waits beside the whole GEMM.  To make that wait
// last, every rank but rank 0 starts its send half later by about the GEMM's
// time alone (a host function on its communication stream, which holds no
// SM): rank 0's receive half then waits for its peers' rows for the whole
// GEMM.  Timed in one loop against the same GEMM alone, for dispatch
// (dispatch_send / dispatch_recv) and for combine (combine_send /
// combine_recv), slowest rank per iteration.  GPU backends only.
#pragma once

#include <string>
#include <vector>

#include "blas_gemm.hpp"
#include "moe_ep_runner.hpp"
#include "side_streams.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

// The default GEMM: 8192^3 in bf16 (1.1 TFLOP); at a 128 x 256 tile, 2048
// output tiles, many waves over any current GPU's SMs, a millisecond or more.
constexpr int kNoSmHeldGemmDim = 8192;

struct NoSmHeldResult {
  int tokens = 0;
  Traffic traffic;
  int64_t wrong_dispatch = -1, wrong_combine = -1;  // the halves checked once, -1: not checked
  GemmShape gemm;
  double delay_us = 0;  // how much later rank 0's peers start their send halves
  PhaseTiming gemm_alone, gemm_in_dispatch, gemm_in_combine;
  bool gate_expired = false;
};

class NoSmHeld {
 public:
  // mnk: --gemm-mnk, or empty for kNoSmHeldGemmDim^3.
  NoSmHeld(const Session& s, const std::vector<int>& mnk);

  // The loaded size through the runner's halves (slot 0): checked (when
  // check) and timed.  Collective.
  NoSmHeldResult measure(MoeEpRunner& runner, bool graph, bool check, const LoopOptions& loop);

  const GemmShape& shape() const { return shape_; }

 private:
  const Session& s_;
  GemmShape shape_;
  SideStreams streams_;
  double delay_us_ = 0;  // read by the host function on the communication stream
};

}  // namespace moe_ep_tool
