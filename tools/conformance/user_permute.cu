// The reference kernels of user_permute.hpp and the buffers they use.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "device_elements.cuh"
#include "dtypes.hpp"
#include "errors.hpp"
#include "user_permute.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 2048;

__device__ inline bool received(int64_t row, int tpr, const int32_t* recv_counts) {
  return row % tpr < recv_counts[row / tpr];
}

// The expert offsets: an aligned exclusive scan of the counts (one thread:
// E_local is a few hundred at most), and the cursors reset.
__global__ void offsets_kernel(const int32_t* counts, int experts, int alignment, int32_t* offsets, int32_t* cursors) {
  int32_t at = 0;
  for (int e = 0; e < experts; ++e) {
    offsets[e] = at;
    cursors[e] = 0;
    at += (counts[e] + alignment - 1) / alignment * alignment;
  }
  offsets[experts] = at;
}

// One block per received row: its local picks take their experts' next rows,
// then the block copies the row to each of them (16-byte words).
__global__ void permute_kernel(const uint4* rows, int64_t row_words, const int32_t* ids, int top_k,
                               const int32_t* recv_counts, int tpr, int64_t num_rows, int first_expert, int experts,
                               const int32_t* offsets, int32_t* cursors, int32_t* slots, uint4* packed) {
  extern __shared__ int32_t dest[];  // [top_k]
  for (int64_t row = blockIdx.x; row < num_rows; row += gridDim.x) {
    if (!received(row, tpr, recv_counts)) continue;
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
      const int e = ids[row * top_k + k] - first_expert;
      const int32_t slot = e >= 0 && e < experts ? offsets[e] + atomicAdd(&cursors[e], 1) : -1;
      dest[k] = slot;
      slots[row * top_k + k] = slot;
    }
    __syncthreads();
    const uint4* x = rows + row * row_words;
    for (int64_t i = threadIdx.x; i < row_words; i += blockDim.x) {
      const uint4 v = x[i];
      for (int k = 0; k < top_k; ++k) {
        if (dest[k] >= 0) packed[int64_t(dest[k]) * row_words + i] = v;
      }
    }
    __syncthreads();
  }
}

using namespace device_elements;

// One block per received row: out = sum over its local picks, in pick order,
// of weight * expert output row, accumulated in fp32.
template <typename T, int kRun>
__global__ void unpermute_kernel(const T* expert_out, const int32_t* slots, const float* weights, int top_k,
                                 const int32_t* recv_counts, int tpr, int64_t num_rows, int hidden, T* out) {
  extern __shared__ int32_t shared[];  // slots [top_k], weights [top_k]
  float* w = reinterpret_cast<float*>(shared + top_k);
  const int runs = hidden / kRun;
  for (int64_t row = blockIdx.x; row < num_rows; row += gridDim.x) {
    if (!received(row, tpr, recv_counts)) continue;
    for (int k = threadIdx.x; k < top_k; k += blockDim.x) {
      shared[k] = slots[row * top_k + k];
      w[k] = weights ? weights[row * top_k + k] : 1.0f;
    }
    __syncthreads();
    auto* y = reinterpret_cast<Run<T, kRun>*>(out + row * hidden);
    for (int i = threadIdx.x; i < runs; i += blockDim.x) {
      float acc[kRun] = {};
      for (int k = 0; k < top_k; ++k) {
        if (shared[k] < 0) continue;
        const Run<T, kRun> a = reinterpret_cast<const Run<T, kRun>*>(expert_out + int64_t(shared[k]) * hidden)[i];
#pragma unroll
        for (int j = 0; j < kRun; ++j) acc[j] += w[k] * to_float(a.v[j]);
      }
      Run<T, kRun> b;
#pragma unroll
      for (int j = 0; j < kRun; ++j) b.v[j] = from_float<T>(acc[j]);
      y[i] = b;
    }
    __syncthreads();
  }
}

template <typename T>
cudaError_t launch_unpermute(const void* expert_out, const int32_t* slots, const float* weights, int top_k,
                             const int32_t* recv_counts, int tpr, int64_t num_rows, int hidden, void* out,
                             cudaStream_t stream) {
  const int blocks = int(std::min<int64_t>(num_rows, kMaxBlocks));
  const size_t shared = size_t(top_k) * (sizeof(int32_t) + sizeof(float));
  constexpr int kRun = 16 / sizeof(T);
  const auto* in = static_cast<const T*>(expert_out);
  auto* o = static_cast<T*>(out);
  if (hidden % kRun == 0) {
    unpermute_kernel<T, kRun>
        <<<blocks, kThreads, shared, stream>>>(in, slots, weights, top_k, recv_counts, tpr, num_rows, hidden, o);
  } else {
    unpermute_kernel<T, 1>
        <<<blocks, kThreads, shared, stream>>>(in, slots, weights, top_k, recv_counts, tpr, num_rows, hidden, o);
  }
  return cudaGetLastError();
}

// Rows of the expert-packed buffer in the worst case: every received row
// once per local pick, and each expert's padding.
int64_t worst_packed_rows(const WorkloadSpec& s, int alignment) {
  const int64_t picks = s.receive_rows() * std::min(s.top_k, s.experts_per_rank());
  return picks + int64_t(s.experts_per_rank()) * (alignment - 1);
}

}  // namespace

std::string user_permute_refusal(bool on_gpu, const WorkloadSpec& s) {
  if (!on_gpu) return "the reference permute kernels are CUDA kernels: a GPU backend is needed";
  if (s.scale_row_elems != 0)
    return "the reference permute kernels move rows without scales (--dtype bf16, fp16 or fp32)";
  if (s.recv_hidden_row_bytes() % 16 != 0) {
    return "the reference permute kernels copy rows in 16-byte words: row bytes " +
           std::to_string(s.recv_hidden_row_bytes()) + " is not a multiple of 16";
  }
  if (!is_float_dtype(s.combine_dtype)) return "the reference un-permute needs a bf16, fp16 or fp32 combine dtype";
  return "";
}

UserPermute::UserPermute(const Place& place, const WorkloadSpec& s, int rank, int alignment)
    : rank_(rank),
      alignment_(alignment),
      packed_rows_(worst_packed_rows(s, alignment)),
      offsets_(place, (uint64_t(s.experts_per_rank()) + 1) * sizeof(int32_t)),
      cursors_(place, uint64_t(s.experts_per_rank()) * sizeof(int32_t)),
      slots_(place, uint64_t(s.receive_rows()) * s.top_k * sizeof(int32_t)),
      packed_(place, uint64_t(packed_rows_) * s.recv_hidden_row_bytes()),
      expert_out_(place, uint64_t(packed_rows_) * s.combine_row_bytes()),
      reduced_(place, uint64_t(s.receive_rows()) * s.combine_row_bytes()) {
  expert_out_.fill(0, nullptr);              // what the expert GEMM would have written: zeros keep every sum finite
  TOOL_CHECK_CUDA(cudaDeviceSynchronize());  // the fill (legacy stream) is done
}

cudaError_t UserPermute::permute(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r, cudaStream_t stream) {
  const int experts = w.experts_per_rank();
  auto* offsets = static_cast<int32_t*>(offsets_.data());
  auto* cursors = static_cast<int32_t*>(cursors_.data());
  offsets_kernel<<<1, 1, 0, stream>>>(static_cast<const int32_t*>(r.local_expert_counts.data), experts, alignment_,
                                      offsets, cursors);
  const int64_t num_rows = w.receive_rows();
  const int blocks = int(std::min<int64_t>(num_rows, kMaxBlocks));
  permute_kernel<<<blocks, kThreads, size_t(w.top_k) * sizeof(int32_t), stream>>>(
      static_cast<const uint4*>(r.hidden_states.data), int64_t(w.recv_hidden_row_bytes() / 16),
      static_cast<const int32_t*>(r.topk_ids.data), w.top_k, static_cast<const int32_t*>(r.recv_counts.data),
      w.tokens_per_rank(), num_rows, rank_ * experts, experts, offsets, cursors, static_cast<int32_t*>(slots_.data()),
      static_cast<uint4*>(packed_.data()));
  return cudaGetLastError();
}

cudaError_t UserPermute::unpermute(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r, cudaStream_t stream) {
  const auto* slots = static_cast<const int32_t*>(slots_.data());
  const auto* weights = static_cast<const float*>(r.topk_weights.data);
  const auto* counts = static_cast<const int32_t*>(r.recv_counts.data);
  const int64_t n = w.receive_rows();
  const int tpr = w.tokens_per_rank();
  if (w.combine_dtype.code == MOE_EP_DTYPE_BFLOAT) {
    return launch_unpermute<__nv_bfloat16>(expert_out_.data(), slots, weights, w.top_k, counts, tpr, n, w.hidden_size,
                                           reduced_.data(), stream);
  }
  if (w.combine_dtype.bits == 16) {
    return launch_unpermute<__half>(expert_out_.data(), slots, weights, w.top_k, counts, tpr, n, w.hidden_size,
                                    reduced_.data(), stream);
  }
  return launch_unpermute<float>(expert_out_.data(), slots, weights, w.top_k, counts, tpr, n, w.hidden_size,
                                 reduced_.data(), stream);
}

int64_t UserPermute::check_permute(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r,
                                   cudaStream_t stream) const {
  const int experts = w.experts_per_rank(), K = w.top_k, tpr = w.tokens_per_rank();
  const int64_t P = w.receive_rows();
  auto copy = [&](void* dst, const void* src, uint64_t bytes) {
    TOOL_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  };
  std::vector<int32_t> counts(experts), offsets(experts + 1), recv(w.world), ids(P * K), slots(P * K);
  copy(counts.data(), r.local_expert_counts.data, counts.size() * sizeof(int32_t));
  copy(offsets.data(), offsets_.data(), offsets.size() * sizeof(int32_t));
  copy(recv.data(), r.recv_counts.data, recv.size() * sizeof(int32_t));
  copy(ids.data(), r.topk_ids.data, ids.size() * sizeof(int32_t));
  copy(slots.data(), slots_.data(), slots.size() * sizeof(int32_t));
  TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
  int64_t wrong = 0, at = 0;
  for (int e = 0; e < experts; ++e) {
    wrong += offsets[e] != at ? 1 : 0;
    at += (int64_t(counts[e]) + alignment_ - 1) / alignment_ * alignment_;
  }
  wrong += offsets[experts] != at ? 1 : 0;
  std::vector<uint8_t> taken(size_t(std::max<int64_t>(at, 0)), 0);
  const uint64_t row_bytes = w.recv_hidden_row_bytes();
  std::vector<uint8_t> want(row_bytes), got(row_bytes);
  int sampled = 0;
  for (int64_t p = 0; p < P; ++p) {
    if (p % tpr >= recv[p / tpr]) continue;
    for (int k = 0; k < K; ++k) {
      const int e = ids[p * K + k] - rank_ * experts;
      const int32_t slot = slots[p * K + k];
      if (e < 0 || e >= experts) {
        wrong += slot != -1 ? 1 : 0;
        continue;
      }
      if (slot < offsets[e] || slot >= offsets[e] + counts[e] || slot >= at || taken[slot]) {
        ++wrong;
        continue;
      }
      taken[slot] = 1;
      if (sampled++ >= 64) continue;  // the bytes of the first rows only: the copy is the same code for all
      copy(want.data(), static_cast<const uint8_t*>(r.hidden_states.data) + p * row_bytes, row_bytes);
      copy(got.data(), static_cast<const uint8_t*>(packed_.data()) + int64_t(slot) * row_bytes, row_bytes);
      TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
      wrong += std::memcmp(want.data(), got.data(), row_bytes) != 0 ? 1 : 0;
    }
  }
  return wrong;
}

}  // namespace moe_ep_tool
