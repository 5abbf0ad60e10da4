// One rank's tensors on its GPU for the test cases, and reading device
// memory back (moe_ep_verify's MemoryReader).  CUDA runtime only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor_view.hpp"
#include "workload.hpp"

namespace moe_ep_test {

using moe_ep_verify::RankInputs;
using moe_ep_verify::WorkloadSpec;

// Device memory of a fixed size, freed with the object.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }
  void upload(const void* src, size_t bytes);

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

// One rank's tensors on the GPU, sized for max_tokens_per_rank rows at fixed
// addresses, so that a captured graph sees each round's new contents.
struct DeviceInputs {
  explicit DeviceInputs(const WorkloadSpec& s);
  void upload(const RankInputs& in, const std::vector<uint8_t>& expert_output_bytes);
  moe_ep_verify::DispatchMemory memory() const;

  DeviceBuffer hidden, ids, weights, scales, eplb, expert_output, output;
};

// `bytes` bytes of device memory at `data`, copied to the host.
std::vector<uint8_t> read_device_memory(const void* data, uint64_t bytes);

}  // namespace moe_ep_test
