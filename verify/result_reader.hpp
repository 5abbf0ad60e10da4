// Reading a backend's results back into host copies, with the shape, dtype,
// device and strides of every result view checked against the workload (each
// mismatch is one wrong element in the verdict).  Where the memory lives is
// the caller's business: it passes a reader (memcpy on the host, a device copy
// on a GPU).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "moe_ep_c.h"
#include "oracle.hpp"
#include "workload.hpp"

namespace moe_ep_verify {

// Returns `bytes` bytes at `data` as a host vector.
using MemoryReader = std::function<std::vector<uint8_t>(const void* data, uint64_t bytes)>;
std::vector<uint8_t> read_host_memory(const void* data, uint64_t bytes);

// `device` is where the backend must have put its results.
ReceivedDispatch read_dispatch(const WorkloadSpec& spec, const moe_ep_dispatch_result_t& result,
                               const moe_ep_device_t& device, const MemoryReader& read, Verdict& verdict);
std::vector<uint8_t> read_combine(const WorkloadSpec& spec, const moe_ep_combine_result_t& result, int num_tokens,
                                  const moe_ep_device_t& device, const MemoryReader& read, Verdict& verdict);

}  // namespace moe_ep_verify
