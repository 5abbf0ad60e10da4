// Placeholder until the kernels land (issue: NVLink two-sided backend): reports
// the platform honestly and refuses to create.
#include "nvlink/nvlink_backend.hpp"

#include <cuda_runtime_api.h>

#include "error.hpp"

namespace moe_ep {

bool nvlink_platform_supported(int32_t device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return false;
  }
  if (device < -1 || device >= count) return false;
  return false;  // no kernels in this build yet
}

uint64_t nvlink_workspace_bytes(const Layout&, const moe_ep_config_t&) {
  fail(MOE_EP_ERROR_UNSUPPORTED, "the NVLINK_TWO_SIDED backend is not built yet");
}

std::unique_ptr<Backend> make_nvlink_backend(const Layout&, const moe_ep_config_t&, const Bootstrap&) {
  fail(MOE_EP_ERROR_UNSUPPORTED, "the NVLINK_TWO_SIDED backend is not built yet");
}

}  // namespace moe_ep
