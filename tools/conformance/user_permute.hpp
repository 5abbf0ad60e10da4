// bench --layout rank_major+user: what a user writes after a RANK_MAJOR
// dispatch when the expert GEMM wants each local expert's rows together, as a
// plain reference to compare the EXPERT_PACKED layout with.
//   permute:   the aligned exclusive scan of local_expert_counts into expert
//              offsets, then one pass over the received rows that copies each
//              row once per local pick to its expert's next row (an atomic
//              cursor per expert: the order inside an expert is not
//              deterministic) and records where each (row, pick) went;
//   unpermute: one pass over the received rows that sums, in fp32, each
//              pick's weight times its expert output row and writes one
//              rank-major row per received token in the combine dtype.
// Straightforward on purpose (one block per row, 16-byte accesses where the
// rows allow them), not tuned.  GPU only.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "memory.hpp"
#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_tool {

// "" when the reference kernels can run this workload here, else why not.
std::string user_permute_refusal(bool on_gpu, const moe_ep_verify::WorkloadSpec& spec);

class UserPermute {
 public:
  // largest: the largest workload of the sweep (buffers are sized for it);
  // rank: this rank (its experts are [rank * E_local, (rank + 1) * E_local)).
  UserPermute(const Place& place, const moe_ep_verify::WorkloadSpec& largest, int rank, int alignment);

  // On the last RANK_MAJOR dispatch result `r` of workload `w`.
  cudaError_t permute(const moe_ep_verify::WorkloadSpec& w, const moe_ep_dispatch_result_t& r, cudaStream_t stream);
  cudaError_t unpermute(const moe_ep_verify::WorkloadSpec& w, const moe_ep_dispatch_result_t& r, cudaStream_t stream);

  // After permute on `r` (read back, not in a capture): wrong (row, pick)
  // destinations (outside their expert's aligned segment, or taken twice),
  // wrong offsets, and wrong bytes in a sample of the packed rows.
  int64_t check_permute(const moe_ep_verify::WorkloadSpec& w, const moe_ep_dispatch_result_t& r,
                        cudaStream_t stream) const;

  int alignment() const { return alignment_; }

 private:
  int rank_, alignment_;
  int64_t packed_rows_;
  Buffer offsets_, cursors_, slots_, packed_, expert_out_, reduced_;
};

}  // namespace moe_ep_tool
