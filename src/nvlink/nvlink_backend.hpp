// The NVLINK_TWO_SIDED backend: GPU kernels over cuMem VMM memory shared by
// the ranks of one NVLink domain (docs/semantics.md §5).
#pragma once

#include <cstdint>
#include <memory>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "params.hpp"

namespace moe_ep {

// Whether this process can run the backend on CUDA device `device` (-1 =
// current).  Never throws: no driver or no GPU means false.  Local.
bool nvlink_platform_supported(int32_t device);

// Device memory create allocates per rank for this layout and config.
uint64_t nvlink_workspace_bytes(const Layout& layout, const moe_ep_config_t& config);

// Collective.
std::unique_ptr<Backend> make_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                             const Bootstrap& bootstrap);

}  // namespace moe_ep
