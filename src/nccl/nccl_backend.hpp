// The NCCL backend: the same dispatch/combine semantics as the other backends
// on CUDA tensors, with NCCL (loaded at run time) moving the bytes between
// GPUs of any topology NCCL supports: several nodes, or GPUs without NVLink.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "params.hpp"

namespace moe_ep {

// Whether this process can run the NCCL backend on CUDA device `device`
// (-1 = current): a usable GPU and an NCCL library that loads.  Never throws;
// when not, *why says what is missing (how to install NCCL, for a library
// that did not load).  Local.
bool nccl_platform_supported(int32_t device, std::string* why);

// Device memory create allocates per rank, for `slots` buffer slots
// (config->micro_batches).
uint64_t nccl_workspace_bytes(const Layout& layout, int32_t slots = 1);

// Collective.
std::unique_ptr<Backend> make_nccl_backend(const Layout& layout, const moe_ep_config_t& config,
                                           const Bootstrap& bootstrap);

}  // namespace moe_ep
