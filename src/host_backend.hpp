// HOST backend: dispatch and combine on CPU tensors, moving data with the
// bootstrap's allgather.  For machines without GPUs, and the oracle that the
// GPU tests compare against.
//
// Every exchange is bounded by timeout_ms: through a BoundedExchange (a late or
// dead peer: TIMEOUT, then the handle is unusable), or under failure_policy
// MASK through the store among the active ranks (a dead peer is masked out).  What
// peers send is checked before use: a dispatch first exchanges a small header
// per rank (call sequence, tokens_per_rank, num_tokens, record size), every
// rank checks every header against its own values, and only then are the
// fixed-size records exchanged.  A mismatch is INVALID_INPUT on every rank.
#pragma once

#include <memory>
#include <vector>

#include "backend.hpp"
#include "bounded_exchange.hpp"
#include "collective_step.hpp"
#include "params.hpp"
#include "store/membership_change.hpp"
#include "store/store_exchange.hpp"

namespace moe_ep {

// Host memory create allocates for this layout and `slots` buffer slots
// (config->micro_batches; what moe_ep_workspace_size reports).
uint64_t host_workspace_bytes(const Layout& layout, int32_t slots);

// What the HOST backend exchanges through.  Default (failure_policy
// FAIL_HANDLE): the bootstrap's allgathers, bounded by timeout_ms, every rank
// in every exchange.  failure_policy MASK: `store` (the same object as
// `exchange`), among the active ranks only; a peer that fails becomes a mask
// (store/store_exchange.hpp), and `fingerprint` is what a rank that rejoins
// must match.
struct HostExchange {
  std::shared_ptr<Exchange> exchange;
  std::shared_ptr<StoreExchange> store;
  std::vector<RankValue> fingerprint;
  // Where the backend leaves its mask and epoch whenever they change (a
  // failure changes them inside a call): the handle's view.
  std::shared_ptr<MembershipState> mirror;
};

// Implements the split phases (docs/overlap.md): dispatch_send exchanges the
// headers, dispatch_recv the records, combine_send stages the expert output
// and combine_recv exchanges it; each exchange bounded by timeout_ms.
std::unique_ptr<Backend> make_host_backend(const Layout& layout, int32_t slots,
                                           std::shared_ptr<BoundedExchange> exchange);
std::unique_ptr<Backend> make_host_backend(const Layout& layout, int32_t slots, HostExchange exchange);
// A replacement process's backend (config->rejoin): built outside the mask,
// then admitted by the survivors' moe_ep_set_active_ranks; *joined gets the
// group's mask and call sequence.  Throws when the admission fails.
std::unique_ptr<Backend> make_rejoining_host_backend(const Layout& layout, int32_t slots, HostExchange exchange,
                                                     MembershipState* joined);

}  // namespace moe_ep
