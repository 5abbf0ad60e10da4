// The grouped-GEMM stand-in expert (bench --expert-gemm grouped): a real
// grouped GEMM run directly on the EXPERT_PACKED rows of a dispatch result,
// with no permute.  For each local expert e with rows, two GEMMs through one
// cublasGemmGroupedBatchedEx call each (blas_gemm.hpp):
//   up:   Y_e[n_e, 2I] = X_e[n_e, H] * W1_e[H, 2I]  (X_e: the result's rows
//         [offsets[e], offsets[e] + n_e), read in place)
//   down: Z_e[n_e, H]  = Y_e[:, :I]  * W2_e[I, H]   (the gate half, without
//         the activation)
// bf16 operands, fp32 accumulation, random weights of E_local experts.  Z
// goes to the tool's own buffer in the same packed layout, so that combine's
// check still compares with the oracle's expert rows; combine reads as many
// bytes either way.
//
// Group sizes: cuBLAS takes them on the host, the dispatch result has them on
// the device.  The tool counts them on the host from the routing it
// generated (the counts dispatch reports: checked against expert_counts once
// per size) and keeps them fixed for the size, so the expert is one
// graph-capturable call with no host wait; the row addresses come from the
// device's expert_offsets on every call (a one-block kernel), so the GEMM
// reads where dispatch wrote.  A server without the counts on the host pays
// one device-to-host copy of E_local counts and a host wait per step
// instead (which also keeps that step out of one CUDA graph).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "blas_gemm.hpp"
#include "memory.hpp"
#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_tool {

// The bytes of one expert's weights, W1 [H, 2I] and W2 [I, H] in bf16: what
// each group of a call reads whatever its rows.
inline uint64_t grouped_expert_weight_bytes(int hidden, int intermediate) {
  return 3ull * uint64_t(hidden) * uint64_t(intermediate) * 2;
}

// "" when this run can use the grouped-GEMM expert, else why not.
std::string grouped_expert_refusal(bool on_gpu, const moe_ep_verify::WorkloadSpec& spec);

// Rows rank `me` receives per local expert for every rank's routing `all`:
// the expert_counts of an EXPERT_PACKED dispatch that drops nothing.
std::vector<int> local_expert_rows(const moe_ep_verify::WorkloadSpec& spec,
                                   const std::vector<moe_ep_verify::RankRouting>& all, int me);

class GroupedExpert {
 public:
  // largest: the largest workload it runs on (an EXPERT_PACKED one); the
  // weights are E_local x (H x 2I + I x H) bf16.
  GroupedExpert(const moe_ep_verify::WorkloadSpec& largest, int intermediate, int sm_target, uint64_t seed);
  ~GroupedExpert();

  // The group sizes of the next calls (host values, one per local expert).
  void set_rows(const std::vector<int>& rows_per_expert);
  // Pairs whose count differs between set_rows and the result's expert_counts
  // (reads them back: not in a capture).
  int64_t count_mismatches(const moe_ep_dispatch_result_t& r, cudaStream_t stream) const;
  // Binds cuBLAS to the stream the calls will use (before any capture).
  void bind(cudaStream_t stream) { blas_->bind(stream); }
  // Both grouped GEMMs on the EXPERT_PACKED result `r`.
  void run(const moe_ep_dispatch_result_t& r, cudaStream_t stream);

  int64_t rows() const { return total_rows_; }  // sum of the group sizes
  int groups() const { return int(groups_.size()); }  // the experts with rows: one group each
  int intermediate() const { return intermediate_; }

 private:
  int experts_, hidden_, intermediate_;
  int64_t max_rows_;
  std::vector<int> rows_, groups_, sizes_;  // per expert; the experts with rows; their sizes
  int64_t total_rows_ = 0;
  Buffer w1_, w2_, y_, z_, group_experts_, pointers_;
  std::unique_ptr<GroupedBlas> blas_;
};

}  // namespace moe_ep_tool
