#include "device_inputs.hpp"

#include "gpu_test_env.hpp"

namespace moe_ep_test {

using namespace moe_ep_verify;

std::vector<uint8_t> read_device_memory(const void* data, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (bytes) cuda_ok(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes_ > 0) cuda_ok(cudaMalloc(&p_, bytes_), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (p_) cudaFree(p_);
}

void DeviceBuffer::upload(const void* src, size_t bytes) {
  if (bytes) cuda_ok(cudaMemcpy(p_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

DeviceInputs::DeviceInputs(const WorkloadSpec& s)
    : hidden(size_t(s.max_tokens_per_rank) * s.hidden_row_bytes() + 16),
      ids(size_t(s.max_tokens_per_rank) * s.top_k * 4),
      weights(size_t(s.max_tokens_per_rank) * s.top_k * 4),
      scales(size_t(s.max_tokens_per_rank) * s.scale_row_bytes() + 16),
      eplb(size_t(s.num_experts) * 4),
      expert_output(size_t(s.world) * s.max_tokens_per_rank * s.combine_row_bytes()),
      output(size_t(s.max_tokens_per_rank) * s.combine_row_bytes()) {}

void DeviceInputs::upload(const RankInputs& in, const std::vector<uint8_t>& eo) {
  hidden.upload(in.hidden.data(), in.hidden.size());
  ids.upload(in.routing.topk_ids.data(), in.routing.topk_ids.size() * 4);
  weights.upload(in.routing.topk_weights.data(), in.routing.topk_weights.size() * 4);
  scales.upload(in.scales.data(), in.scales.size());
  eplb.upload(in.eplb_local.data(), in.eplb_local.size() * 4);
  expert_output.upload(eo.data(), eo.size());
}

DispatchMemory DeviceInputs::memory() const {
  return {hidden.get(), ids.get(), weights.get(), scales.get(), eplb.get()};
}

}  // namespace moe_ep_test
