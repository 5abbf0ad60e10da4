// Checked CUDA runtime calls.  Kept apart from errors.hpp so that files that
// never touch CUDA do not include its headers.
#pragma once

#include <cuda_runtime_api.h>

#include "errors.hpp"

namespace moe_ep_tool {

inline void check_cuda(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw ToolError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                  cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

}  // namespace moe_ep_tool

#define TOOL_CHECK_CUDA(call) ::moe_ep_tool::check_cuda((call), #call, __FILE__, __LINE__)
