// The GPU backends' entry points in a build without them (-DMOE_EP_WITH_CUDA=OFF:
// no CUDA toolkit needed, HOST backend only; used by the sanitizer and fuzzing
// builds).  AUTO then always resolves to HOST.
#include <string>

#include "error.hpp"
#include "common/gpu_context.hpp"
#include "nccl/nccl_backend.hpp"
#include "nvlink/nvlink_backend.hpp"

namespace moe_ep {

namespace {
[[noreturn]] void not_built(const char* backend) {
  fail(MOE_EP_ERROR_UNSUPPORTED, backend, ": not in this build of moe_ep (MOE_EP_WITH_CUDA=OFF)");
}
}  // namespace

void* current_gpu_context() noexcept { return nullptr; }
void make_gpu_context_current(void* /*context*/) noexcept {}

bool nvlink_platform_supported(int32_t /*device*/) { return false; }

uint64_t nvlink_workspace_bytes(const Layout& /*layout*/, const moe_ep_config_t& /*config*/) {
  not_built("NVLINK_TWO_SIDED");
}

std::unique_ptr<Backend> make_nvlink_backend(const Layout& /*layout*/, const moe_ep_config_t& /*config*/,
                                             const Bootstrap& /*bootstrap*/) {
  not_built("NVLINK_TWO_SIDED");
}

std::unique_ptr<Backend> make_masking_nvlink_backend(const Layout& /*layout*/, const moe_ep_config_t& /*config*/,
                                                     const Bootstrap& /*bootstrap*/, NvlinkMasking /*masking*/) {
  not_built("NVLINK_TWO_SIDED");
}

std::unique_ptr<Backend> make_rejoining_nvlink_backend(const Layout& /*layout*/, const moe_ep_config_t& /*config*/,
                                                       NvlinkMasking /*masking*/) {
  not_built("NVLINK_TWO_SIDED");
}

bool nccl_platform_supported(int32_t /*device*/, std::string* why) {
  if (why != nullptr) *why = "NCCL: not in this build of moe_ep (MOE_EP_WITH_CUDA=OFF)";
  return false;
}

uint64_t nccl_workspace_bytes(const Layout& /*layout*/, int32_t /*slots*/) { not_built("NCCL"); }

std::unique_ptr<Backend> make_nccl_backend(const Layout& /*layout*/, const moe_ep_config_t& /*config*/,
                                           const Bootstrap& /*bootstrap*/) {
  not_built("NCCL");
}

}  // namespace moe_ep
