// The decode step's stand-in for the expert computation (bench --decode-step).
// It reads every received row of a dispatch result and writes that row's
// expert output, y = kStandInExpertScale * x element by element, rounded to
// the combine dtype: the bytes a real expert reads and writes, without the
// arithmetic.  Padding rows are skipped, as an expert driven by recv_counts
// would skip them.  One rule (stand_in_expert_value) runs on the GPU (a
// kernel behind launch_stand_in_expert), on the host (the HOST backend), and
// in the model the check compares combine's output with.
#pragma once

#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>
#include <string>

#include "moe_ep_c.h"
#include "oracle.hpp"
#include "workload.hpp"

#if defined(__CUDACC__)
#define MOE_EP_TOOL_HOST_DEVICE __host__ __device__
#else
#define MOE_EP_TOOL_HOST_DEVICE
#endif

namespace moe_ep_tool {

// A power of two: the product of a normal value is exact, so the GPU and the
// host model agree bit for bit.
constexpr float kStandInExpertScale = 2.0f;

// One element.  The payload travels as random bytes, so NaN, infinities and
// subnormals occur in it; they become 0, which keeps every product and every
// sum of the combine finite and independent of flush-to-zero modes.
MOE_EP_TOOL_HOST_DEVICE inline float stand_in_expert_value(float x) {
  const float magnitude = x < 0.0f ? -x : x;
  const bool scalable = magnitude >= FLT_MIN && magnitude <= FLT_MAX / kStandInExpertScale;  // false for NaN
  return scalable ? x * kStandInExpertScale : 0.0f;
}

// Whether receive row `row` holds a token: rows [s * tokens_per_rank,
// s * tokens_per_rank + recv_counts[s]) of each source rank s do.
MOE_EP_TOOL_HOST_DEVICE inline bool is_received_row(int64_t row, int tokens_per_rank, const int32_t* recv_counts) {
  return row % tokens_per_rank < recv_counts[row / tokens_per_rank];
}

struct StandInExpertArgs {
  const void* rows = nullptr;            // the dispatch result's hidden_states, [world * tokens_per_rank, hidden]
  moe_ep_dtype_t rows_dtype{};           // bf16, fp16 or fp32
  const int32_t* recv_counts = nullptr;  // [world]
  void* out = nullptr;                   // expert output, [world * tokens_per_rank, hidden]
  moe_ep_dtype_t out_dtype{};            // the combine dtype: bf16, fp16 or fp32
  int world = 0, tokens_per_rank = 0, hidden = 0;
};

// "" when the stand-in can run on this workload (float payload without
// scales, one element per hidden unit), else why not, naming the option.
std::string stand_in_expert_refusal(const moe_ep_verify::WorkloadSpec& spec);

// The arguments for rank's dispatch result `result`, writing into `out`.
StandInExpertArgs stand_in_expert_args(const moe_ep_verify::WorkloadSpec& spec, const moe_ep_dispatch_result_t& result,
                                       void* out);

// GPU: queues the kernel on `stream` (device memory); returns the launch status.
cudaError_t launch_stand_in_expert(const StandInExpertArgs& args, cudaStream_t stream);

// Host memory (the HOST backend): the same rows, the same values.
void run_stand_in_expert_host(const StandInExpertArgs& args);

// What the stand-in wrote on any rank in the receive row that holds token
// `token` of rank `me`: the model check_combine sums in place of
// make_expert_output when every rank ran the stand-in.
moe_ep_verify::ExpertRowModel stand_in_expert_model(const moe_ep_verify::WorkloadSpec& spec, int me);

}  // namespace moe_ep_tool
