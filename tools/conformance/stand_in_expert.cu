// The stand-in expert's kernel: one block per received row (grid-strided),
// each thread a run of consecutive elements; 16-byte loads where the rows are
// aligned for them.  Only stand_in_expert.hpp's launch function is public.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "device_elements.cuh"
#include "stand_in_expert.hpp"

namespace moe_ep_tool {

namespace {

using namespace device_elements;

template <typename In, typename Out, int kRun>
__global__ void stand_in_expert_kernel(const In* rows, Out* out, const int32_t* recv_counts, int tokens_per_rank,
                                       int64_t num_rows, int hidden) {
  const int runs = hidden / kRun;
  for (int64_t row = blockIdx.x; row < num_rows; row += gridDim.x) {
    if (!is_received_row(row, tokens_per_rank, recv_counts)) continue;
    const auto* x = reinterpret_cast<const Run<In, kRun>*>(rows + row * hidden);
    auto* y = reinterpret_cast<Run<Out, kRun>*>(out + row * hidden);
    for (int i = threadIdx.x; i < runs; i += blockDim.x) {
      const Run<In, kRun> a = x[i];
      Run<Out, kRun> b;
#pragma unroll
      for (int k = 0; k < kRun; ++k) b.v[k] = from_float<Out>(stand_in_expert_value(to_float(a.v[k])));
      y[i] = b;
    }
  }
}

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

template <typename In, typename Out>
cudaError_t launch_typed(const StandInExpertArgs& a, cudaStream_t stream) {
  const int64_t num_rows = int64_t(a.world) * a.tokens_per_rank;
  if (num_rows == 0 || a.hidden == 0) return cudaSuccess;
  const int blocks = int(std::min<int64_t>(num_rows, kMaxBlocks));
  const auto* in = static_cast<const In*>(a.rows);
  auto* out = static_cast<Out*>(a.out);
  constexpr int kRun = 16 / sizeof(In);  // one 16-byte load per run
  const bool aligned = a.hidden % kRun == 0 && reinterpret_cast<uintptr_t>(in) % (sizeof(In) * kRun) == 0 &&
                       reinterpret_cast<uintptr_t>(out) % (sizeof(Out) * kRun) == 0;
  if (aligned) {
    stand_in_expert_kernel<In, Out, kRun>
        <<<blocks, kThreads, 0, stream>>>(in, out, a.recv_counts, a.tokens_per_rank, num_rows, a.hidden);
  } else {
    stand_in_expert_kernel<In, Out, 1>
        <<<blocks, kThreads, 0, stream>>>(in, out, a.recv_counts, a.tokens_per_rank, num_rows, a.hidden);
  }
  return cudaGetLastError();
}

template <typename In>
cudaError_t launch_to(const StandInExpertArgs& a, cudaStream_t stream) {
  if (a.out_dtype.code == MOE_EP_DTYPE_BFLOAT) return launch_typed<In, __nv_bfloat16>(a, stream);
  if (a.out_dtype.bits == 16) return launch_typed<In, __half>(a, stream);
  return launch_typed<In, float>(a, stream);
}

}  // namespace

cudaError_t launch_stand_in_expert(const StandInExpertArgs& a, cudaStream_t stream) {
  // The dtypes were checked by stand_in_expert_refusal (bf16, fp16, fp32).
  if (a.rows_dtype.code == MOE_EP_DTYPE_BFLOAT) return launch_to<__nv_bfloat16>(a, stream);
  if (a.rows_dtype.bits == 16) return launch_to<__half>(a, stream);
  return launch_to<float>(a, stream);
}

}  // namespace moe_ep_tool
