// bench --micro-batch-overlap: a step of two micro-batches, as a server with
// dual- or two-batch overlap runs it.  Each micro-batch (A and B, T/2 tokens
// per rank each) does dispatch -> its experts' GEMMs on the rows it received
// -> combine.  One handle with config.micro_batches = 2; the host issues
//   A.dispatch_send  B.dispatch_send  A.dispatch_recv  GEMM(A)  B.dispatch_recv
//   A.combine_send   GEMM(B)          A.combine_recv   B.combine_send  B.combine_recv
// with the halves on the communication stream and the GEMMs on the compute
// stream (side_streams.hpp), ordered by events: GEMM(X) after X.dispatch_recv,
// X.combine_send after GEMM(X).  So B's rows travel while GEMM(A) runs, and
// A's combine while GEMM(B) runs.  Timed in one loop against the same work
// with the fused calls in sequence on one stream, the communication alone
// (the step's calls without the GEMMs) and the compute alone (the GEMMs).
// With -G each of the four is one CUDA graph.  On the HOST backend the GEMMs
// run on the host (a plain loop), so the schedule and its check run there.
// With --expert-gemm grouped (GPU) the GEMMs of a micro-batch are the
// grouped-GEMM expert's two grouped calls on its EXPERT_PACKED rows
// (grouped_expert.hpp), one GEMM per local expert.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "blas_gemm.hpp"
#include "grouped_expert.hpp"
#include "moe_ep_runner.hpp"
#include "side_streams.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

// DeepSeek-V3's routed expert: hidden 7168 -> intermediate 2048 (gate and up
// projections, 2 x 2048) -> hidden.
constexpr int kDeepSeekExpertIntermediate = 2048;

struct MicroBatchResult {
  int tokens = 0;  // T per rank: micro-batches of T/2
  Traffic traffic[2];
  // The GEMMs of each micro-batch on this rank's experts: up-projection
  // M x 2I x H, down-projection M x H x I, M = the local picks of its
  // received rows, or (--expert-rows rows) the received rows (the largest
  // over ranks; each rank runs its own M).
  int64_t m[2] = {0, 0};
  int64_t wrong_dispatch = -1, wrong_combine = -1, wrong_step = -1;  // -1: not checked
  PhaseTiming step, fused, comm, compute;
  bool gate_expired = false;
};

// Why this run cannot measure it ("" = it can): on a GPU, cuBLAS; on the
// host, a GEMM small enough for the host loop.  Decided alike on every rank.
std::string micro_batch_refusal(const Session& s, const WorkloadSpec& largest_micro_batch, int intermediate);

class MicroBatchOverlap {
 public:
  // largest: the largest micro-batch's workload (T/2 tokens per rank).
  // m_rows: M counts the received rows, not their local picks.  grouped:
  // the grouped-GEMM expert (largest is then an EXPERT_PACKED workload).
  MicroBatchOverlap(const Session& s, const WorkloadSpec& largest, int intermediate, bool m_rows, bool graph,
                    bool grouped = false);
  ~MicroBatchOverlap();

  // Why the handle cannot run two micro-batches through the halves ("" = it
  // can): create's or the first half's UNSUPPORTED, with the library's
  // message.  Runs one untimed split pair on `w`.  Collective.
  std::string probe(const WorkloadSpec& w);

  // One size: `w` is one micro-batch's workload (T/2 tokens); A and B take
  // other inputs derived from it.  Checked with `check`, then timed.  Collective.
  MicroBatchResult measure(const WorkloadSpec& w, bool check, const LoopOptions& loop);

  int intermediate() const { return intermediate_; }
  int sm_target() const { return sm_target_; }

 private:
  class Gemm;
  struct Batch;
  void step(void* stream);
  void fused(void* stream);
  void comm(void* stream);
  void compute(void* stream);
  void run_gemms(int i, void* stream);
  void run_phase(int phase, void* stream);  // eagerly
  void launch(int phase, void* stream);     // a replay of its graph with -G, else eagerly
  void capture();
  void drop();
  std::pair<int64_t, int64_t> check_halves();  // (dispatch, combine) wrong, over every rank
  int64_t check_step(const WorkloadSpec& w);
  // Both micro-batches' inputs for `w`, from seeds derived with `inputs`.
  void load(const WorkloadSpec& w, uint64_t inputs);

  const Session& s_;
  int intermediate_;
  bool m_rows_;
  bool graph_;
  bool grouped_;
  int sm_target_ = 0;
  moe_ep_status_t created_ = MOE_EP_SUCCESS;
  std::string refusal_;
  std::unique_ptr<EpHandle> handle_;
  std::unique_ptr<Batch> batches_[2];
  SideStreams streams_;
  std::unique_ptr<CapturedCall> graphs_[4];  // step, fused, comm, compute
};

}  // namespace moe_ep_tool
