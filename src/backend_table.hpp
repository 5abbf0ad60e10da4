// The backends the handle can create, one entry each: its name, whether this
// process can run it, the memory it allocates, and how to build one.  The
// handle (and through it the C shim) reaches the backends only through this
// table; which backend AUTO picks is decided here too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "bounded_exchange.hpp"
#include "moe_ep_c.h"
#include "params.hpp"

namespace moe_ep {

struct BackendEntry {
  int32_t id;        // MOE_EP_BACKEND_*
  const char* name;  // as in the enum: "NVLINK_TWO_SIDED", "NCCL", "HOST"
  // Whether this process can run it on CUDA device `device` (-1 = current);
  // where not, *why (when not NULL) says why.  Local, never throws.
  bool (*platform_supported)(int32_t device, std::string* why);
  // Bytes create allocates per rank (device memory for the GPU backends).
  uint64_t (*workspace_bytes)(const Layout& layout, const moe_ep_config_t& config);
  // Collective: builds the backend once the group agreed on it.  The HOST
  // backend runs its exchanges through `exchange`; the GPU backends bound
  // their own waits and release it first (its worker is joined).
  std::unique_ptr<Backend> (*create)(const Layout& layout, const moe_ep_config_t& config, const Bootstrap& bootstrap,
                                     std::shared_ptr<BoundedExchange> exchange);
  // The most buffer slots (config->micro_batches) it implements.
  int32_t max_micro_batches;
  // Whether it lays the received rows out in the expert layouts
  // (params->receive_layout EXPERT_MAJOR and EXPERT_PACKED), not only RANK_MAJOR.
  bool expert_layouts;
  // Whether it has the FP8 wire format (MOE_EP_WIRE_FP8_E4M3_BLOCK128), not
  // only AS_IS, for params->dispatch_wire and for params->combine_wire.
  bool fp8_dispatch_wire;
  bool fp8_combine_wire;
};

// What create (and moe_ep_workspace_size) refuse before anything is
// allocated: UNSUPPORTED when `backend` does not implement config->micro_batches,
// params->receive_layout or a wire format (params->dispatch_wire, combine_wire),
// with the reason.
void check_backend_capabilities(int32_t backend, const Layout& layout, int32_t micro_batches);

// The entry of MOE_EP_BACKEND_NVLINK_TWO_SIDED, _NCCL or _HOST (not AUTO).
const BackendEntry& backend_entry(int32_t id);

// Which backend create would use; throws UNSUPPORTED for an explicit NVLINK or
// NCCL request that this process cannot run.  Local (no collective).
int32_t resolve_backend_locally(const moe_ep_config_t& config);

// Collective.  AUTO: NVLINK_TWO_SIDED when every rank supports it and all run
// on one host (one NVLink domain with peer access), else NCCL when it loads on
// every rank with a GPU, else HOST.  Explicit choices were checked locally;
// NVLINK_TWO_SIDED must also hold on every rank.  `config.backend` is this
// rank's resolve_backend_locally answer, `asked` the caller's request.
int32_t agree_on_backend(const Exchange& exchange, int32_t asked, const moe_ep_config_t& config);

}  // namespace moe_ep
