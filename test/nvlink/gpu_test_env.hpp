// Process-wide facts of a GPU test run, set by gpu_test_main.cpp before any
// test case runs: which CUDA device this rank uses.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace moe_ep_test {

int gpu_device();
int gpu_device_count();

// Throws with the call's text when a CUDA runtime call fails.
inline void cuda_ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
  }
}

}  // namespace moe_ep_test
