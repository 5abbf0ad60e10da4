// The NVLink entry points in a build without the NVLINK_TWO_SIDED backend
// (-DMOE_EP_WITH_NVLINK=OFF: no CUDA toolkit needed, HOST backend only; used by
// the sanitizer and fuzzing builds).  AUTO then always resolves to HOST.
#include "error.hpp"
#include "nvlink/nvlink_backend.hpp"

namespace moe_ep {

bool nvlink_platform_supported(int32_t /*device*/) { return false; }

uint64_t nvlink_workspace_bytes(const Layout& /*layout*/, const moe_ep_config_t& /*config*/) {
  fail(MOE_EP_ERROR_UNSUPPORTED, "NVLINK_TWO_SIDED: not in this build of moe_ep (MOE_EP_WITH_NVLINK=OFF)");
}

std::unique_ptr<Backend> make_nvlink_backend(const Layout& /*layout*/, const moe_ep_config_t& /*config*/,
                                             const Bootstrap& /*bootstrap*/) {
  fail(MOE_EP_ERROR_UNSUPPORTED, "NVLINK_TWO_SIDED: not in this build of moe_ep (MOE_EP_WITH_NVLINK=OFF)");
}

}  // namespace moe_ep
