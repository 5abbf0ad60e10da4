#include "errors.hpp"

#include <mpi.h>

namespace moe_ep_tool {

void fail(const std::string& message) { throw ToolError(message); }

void check_moe(moe_ep_status_t status, const char* call) {
  if (status == MOE_EP_SUCCESS) return;
  throw MoeEpError(status, std::string(call) + " returned " + moe_ep_status_string(status) + ": " +
                               moe_ep_last_error());
}

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw ToolError(std::string(call) + " failed: " + std::string(text, length));
}

void check_cuda(cudaError_t rc, const char* call, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw ToolError(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(rc) +
                  " (" + cudaGetErrorString(rc) + ")");
}

}  // namespace moe_ep_tool
