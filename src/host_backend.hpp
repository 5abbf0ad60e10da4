// HOST backend: dispatch and combine on CPU tensors, moving data with the
// bootstrap's allgather.  For machines without GPUs, and the oracle that the
// GPU tests compare against.
//
// Every exchange goes through a BoundedExchange, so a late or dead peer costs
// at most timeout_ms per exchange (TIMEOUT, then the handle is unusable).  What
// peers send is checked before use: a dispatch first exchanges a small header
// per rank (call sequence, tokens_per_rank, num_tokens, record size), every
// rank checks every header against its own values, and only then are the
// fixed-size records exchanged.  A mismatch is INVALID_INPUT on every rank.
#pragma once

#include <memory>

#include "backend.hpp"
#include "bounded_exchange.hpp"
#include "params.hpp"

namespace moe_ep {

// Host memory create allocates for this layout and `slots` buffer slots
// (config->micro_batches; what moe_ep_workspace_size reports).
uint64_t host_workspace_bytes(const Layout& layout, int32_t slots);

// Implements the split phases (docs/overlap.md): dispatch_send exchanges the
// headers, dispatch_recv the records, combine_send stages the expert output
// and combine_recv exchanges it; each exchange bounded by timeout_ms.
std::unique_ptr<Backend> make_host_backend(const Layout& layout, int32_t slots,
                                           std::shared_ptr<BoundedExchange> exchange);

}  // namespace moe_ep
