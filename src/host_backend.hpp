// HOST backend (SPEC §4): dispatch and combine on CPU tensors, moving data with
// the bootstrap's allgather.  For machines without GPUs, and the oracle that
// the GPU tests compare against.
#pragma once

#include <memory>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "params.hpp"

namespace moe_ep {

// Host memory create allocates for this layout (what moe_ep_workspace_size reports).
uint64_t host_workspace_bytes(const Layout& layout);

std::unique_ptr<Backend> make_host_backend(const Layout& layout, const Bootstrap& bootstrap);

}  // namespace moe_ep
