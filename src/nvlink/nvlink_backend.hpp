// The NVLINK_TWO_SIDED backend: GPU kernels over cuMem VMM memory shared by
// the ranks of one NVLink domain (docs/semantics.md §5).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "collective_step.hpp"
#include "params.hpp"
#include "store/membership_change.hpp"
#include "store/store_exchange.hpp"

namespace moe_ep {

// Whether this process can run the backend on CUDA device `device` (-1 =
// current).  Never throws: no driver or no GPU means false.  Local.
bool nvlink_platform_supported(int32_t device);

// Device memory create allocates per rank for this layout and config.
uint64_t nvlink_workspace_bytes(const Layout& layout, const moe_ep_config_t& config);

// Collective.
std::unique_ptr<Backend> make_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                             const Bootstrap& bootstrap);

// failure_policy MASK: create runs over `bootstrap` as above; afterwards the
// group agrees through the store only (a failure found by a kernel, a mask
// change), and the survivors resynchronise their workspaces
// (docs/nvlink_backend.md, "Surviving a dead rank").  Collective.
struct NvlinkMasking {
  std::shared_ptr<StoreExchange> store;
  std::vector<RankValue> fingerprint;       // what a mask change compares
  std::shared_ptr<MembershipState> mirror;  // the handle's copy of the mask
};
std::unique_ptr<Backend> make_masking_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                                     const Bootstrap& bootstrap, NvlinkMasking masking);
// A replacement process for a rank that such a group masked (config->rejoin):
// joins through the store only, collective with the survivors' call to
// moe_ep_set_active_ranks that makes it active (docs/nvlink_backend.md,
// "Taking a rank back").  masking.store holds the group's newest membership.
std::unique_ptr<Backend> make_rejoining_nvlink_backend(const Layout& layout, const moe_ep_config_t& config,
                                                       NvlinkMasking masking);

}  // namespace moe_ep
