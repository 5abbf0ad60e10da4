// The grouped-GEMM stand-in expert of grouped_expert.hpp: its buffers, the
// kernel that turns the device's expert offsets into the GEMMs' pointer
// arrays, and the two grouped calls.
#include <cuda_bf16.h>

#include <algorithm>

#include "dtypes.hpp"
#include "errors.hpp"
#include "grouped_expert.hpp"
#include "random_fill.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

namespace {

constexpr int kPointerArrays = 6;  // up: A, B, C; down: A, B, C

Place this_device() {
  int device = 0;
  TOOL_CHECK_CUDA(cudaGetDevice(&device));
  return Place{true, device};
}

// Group g (expert experts[g], sizes[g] rows): its operands' addresses.  The
// first row is clamped so that sizes fixed for one routing stay inside the
// result on another (the step's check runs other inputs through the same graph).
__global__ void pointers_kernel(const int32_t* experts, const int32_t* sizes, int groups, const int32_t* offsets,
                                int64_t bound, const __nv_bfloat16* x, const __nv_bfloat16* w1, const __nv_bfloat16* w2,
                                __nv_bfloat16* y, __nv_bfloat16* z, int hidden, int inter, const void** out) {
  for (int g = blockIdx.x * blockDim.x + threadIdx.x; g < groups; g += gridDim.x * blockDim.x) {
    const int e = experts[g];
    const int64_t first = min(int64_t(offsets[e]), bound - sizes[g]);
    out[0 * groups + g] = w1 + int64_t(e) * hidden * 2 * inter;
    out[1 * groups + g] = x + first * hidden;
    out[2 * groups + g] = y + first * 2 * inter;
    out[3 * groups + g] = w2 + int64_t(e) * inter * hidden;
    out[4 * groups + g] = y + first * 2 * inter;
    out[5 * groups + g] = z + first * hidden;
  }
}

void fill_random(Buffer& b, uint64_t seed) {
  TOOL_CHECK_CUDA(launch_fill_uniform_bf16(b.data(), b.bytes() / 2, seed, nullptr));
}

}  // namespace

std::string grouped_expert_refusal(bool on_gpu, const WorkloadSpec& s) {
  if (!on_gpu) return "--expert-gemm grouped runs cuBLAS on the GPU: a GPU backend is needed";
  if (s.recv_hidden_dtype().code != MOE_EP_DTYPE_BFLOAT || s.recv_hidden_dtype().bits != 16 ||
      s.recv_scale_row_elems() != 0) {
    return "--expert-gemm grouped reads bf16 rows without scales (--dtype bf16), got " +
           dtype_name(s.recv_hidden_dtype());
  }
  if (s.row_elems() != s.hidden_size) return "--expert-gemm grouped needs one payload element per hidden unit";
  return GroupedBlas::unavailable_reason();
}

std::vector<int> local_expert_rows(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me) {
  const int experts = s.experts_per_rank();
  std::vector<int> rows(experts, 0);
  for (const RankRouting& r : all) {
    for (int32_t id : r.topk_ids) {
      if (s.owner(id) == me) ++rows[id - me * experts];
    }
  }
  return rows;
}

GroupedExpert::GroupedExpert(const WorkloadSpec& s, int intermediate, int sm_target, uint64_t seed)
    : experts_(s.experts_per_rank()),
      hidden_(s.hidden_size),
      intermediate_(intermediate),
      max_rows_(s.expert_layout_rows()) {
  const Place place = this_device();
  w1_ = Buffer(place, uint64_t(experts_) * hidden_ * 2 * intermediate_ * 2);
  w2_ = Buffer(place, uint64_t(experts_) * intermediate_ * hidden_ * 2);
  y_ = Buffer(place, uint64_t(max_rows_) * 2 * intermediate_ * 2);
  z_ = Buffer(place, uint64_t(max_rows_) * hidden_ * 2);
  group_experts_ = Buffer(place, uint64_t(experts_) * 2 * sizeof(int32_t));
  pointers_ = Buffer(place, uint64_t(experts_) * kPointerArrays * sizeof(void*));
  fill_random(w1_, seed);
  fill_random(w2_, seed + 1);
  TOOL_CHECK_CUDA(cudaDeviceSynchronize());  // the fills (legacy stream) are done
  blas_ = std::make_unique<GroupedBlas>(sm_target);
}

GroupedExpert::~GroupedExpert() = default;

void GroupedExpert::set_rows(const std::vector<int>& rows) {
  if (int(rows.size()) != experts_) {
    fail("GroupedExpert::set_rows: expected " + std::to_string(experts_) + " sizes, got " +
         std::to_string(rows.size()));
  }
  rows_ = rows;
  groups_.clear();
  sizes_.clear();
  total_rows_ = 0;
  for (int e = 0; e < experts_; ++e) {
    if (rows[e] == 0) continue;
    groups_.push_back(e);
    sizes_.push_back(rows[e]);
    total_rows_ += rows[e];
  }
  std::vector<int32_t> table(groups_.begin(), groups_.end());
  table.insert(table.end(), sizes_.begin(), sizes_.end());
  TOOL_CHECK_CUDA(
      cudaMemcpy(group_experts_.data(), table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
}

int64_t GroupedExpert::count_mismatches(const moe_ep_dispatch_result_t& r, cudaStream_t stream) const {
  std::vector<int32_t> got(experts_);
  TOOL_CHECK_CUDA(
      cudaMemcpyAsync(got.data(), r.expert_counts.data, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
  int64_t wrong = 0;
  for (int e = 0; e < experts_; ++e) wrong += got[e] != (e < int(rows_.size()) ? rows_[e] : -1) ? 1 : 0;
  return wrong;
}

void GroupedExpert::run(const moe_ep_dispatch_result_t& r, cudaStream_t stream) {
  const int groups = int(groups_.size());
  if (groups == 0) return;
  if (r.hidden_states.data == nullptr || r.expert_offsets.data == nullptr || r.hidden_states.ndim != 2) {
    fail("--expert-gemm grouped: the dispatch result has no EXPERT_PACKED rows and expert_offsets");
  }
  const int64_t bound = r.hidden_states.shape[0];
  if (total_rows_ > bound || bound > max_rows_) {
    fail("--expert-gemm grouped: " + std::to_string(total_rows_) + " rows in groups, the result has " +
         std::to_string(bound) + " (buffers for " + std::to_string(max_rows_) + ")");
  }
  const auto* group_table = static_cast<const int32_t*>(group_experts_.data());
  auto** p = static_cast<const void**>(pointers_.data());
  pointers_kernel<<<1, 256, 0, stream>>>(
      group_table, group_table + groups, groups, static_cast<const int32_t*>(r.expert_offsets.data), bound,
      static_cast<const __nv_bfloat16*>(r.hidden_states.data), static_cast<const __nv_bfloat16*>(w1_.data()),
      static_cast<const __nv_bfloat16*>(w2_.data()), static_cast<__nv_bfloat16*>(y_.data()),
      static_cast<__nv_bfloat16*>(z_.data()), hidden_, intermediate_, p);
  TOOL_CHECK_CUDA(cudaGetLastError());
  const int I = intermediate_, H = hidden_;
  // Column-major views of the row-major rows: X_e^T [H, n], Y_e^T [2I, n], Z_e^T [H, n].
  blas_->run(2 * I, H, sizes_, p + 0 * groups, 2 * I, p + 1 * groups, H, const_cast<void* const*>(p + 2 * groups),
             2 * I, stream);
  blas_->run(H, I, sizes_, p + 3 * groups, H, p + 4 * groups, 2 * I, const_cast<void* const*>(p + 5 * groups), H,
             stream);
}

}  // namespace moe_ep_tool
