// Small synchronous copies between the host and a handle's device records
// (error records, control blocks), on the handle's private stream, so that
// they wait for nothing else on the device.  Throws CUDA_ERROR naming `what`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/cuda_check.hpp"

namespace moe_ep {

template <typename T>
T read_from_device(const T* device, cudaStream_t stream, const char* what) {
  T value{};
  check_cuda(cudaMemcpyAsync(&value, device, sizeof(T), cudaMemcpyDeviceToHost, stream), what);
  check_cuda(cudaStreamSynchronize(stream), what);
  return value;
}

inline void write_to_device(void* device, const void* host, size_t bytes, cudaStream_t stream, const char* what) {
  check_cuda(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream), what);
  check_cuda(cudaStreamSynchronize(stream), what);
}

}  // namespace moe_ep
