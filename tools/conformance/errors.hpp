// How the tool fails: every CUDA, NCCL, MPI and moe_ep call is checked, and a
// failure becomes a ToolError that names the call, so that main() can print
// it with the rank and stop every rank (a half-dead MPI job would hang).
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep_tool {

class ToolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A moe_ep call that failed: keeps the status so that a case can expect one.
class MoeEpError : public ToolError {
 public:
  MoeEpError(moe_ep_status_t status, const std::string& what) : ToolError(what), status_(status) {}
  moe_ep_status_t status() const { return status_; }

 private:
  moe_ep_status_t status_;
};

[[noreturn]] void fail(const std::string& message);

// Throws MoeEpError with moe_ep_last_error() unless status is SUCCESS.
void check_moe(moe_ep_status_t status, const char* call);
// Throws unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* call);
// Throws unless rc is cudaSuccess; names the call and where it was made.
void check_cuda(cudaError_t rc, const char* call, const char* file, int line);

}  // namespace moe_ep_tool

#define TOOL_CHECK_MOE(call) ::moe_ep_tool::check_moe((call), #call)
#define TOOL_CHECK_MPI(call) ::moe_ep_tool::check_mpi((call), #call)
#define TOOL_CHECK_CUDA(call) ::moe_ep_tool::check_cuda((call), #call, __FILE__, __LINE__)
