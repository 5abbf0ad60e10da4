// CUDA runtime calls of the backend go through check_cuda, so that a failure
// becomes a moe_ep::Error naming the call (and never a silent sticky error).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/cuda_driver_probe.hpp"
#include "error.hpp"

namespace moe_ep {

inline void check_cuda(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return;
  cudaGetLastError();  // clear it: a later call must not report this one
  if (rc == cudaErrorInsufficientDriver) {  // also what the runtime says where there is no driver at all
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    fail(MOE_EP_ERROR_CUDA, what, ": ", describe_insufficient_driver(driver, runtime),
         " (cudaErrorInsufficientDriver)");
  }
  fail(rc == cudaErrorMemoryAllocation ? MOE_EP_ERROR_OUT_OF_MEMORY : MOE_EP_ERROR_CUDA, what, ": ",
       cudaGetErrorName(rc), " (", cudaGetErrorString(rc), ")");
}

// The device a config names: its ordinal, or the caller's current device for -1.
inline int resolve_device(int32_t configured) {
  int device = configured;
  if (device < 0) check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  return device;
}

// Makes `device` current for the lifetime of the guard and restores the
// caller's device afterwards (a handle may be used from any thread).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace moe_ep
