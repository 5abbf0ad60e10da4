// What a handle does when a peer fails, chosen by config->failure_policy
// (docs/reliability.md, "Surviving a dead rank"): the default leaves the
// handle broken (handle_health.hpp); MASK (HOST and NVLINK_TWO_SIDED) lets the
// survivors agree through the store, so that a failure becomes a mask, and
// lets a replacement process rejoin a HOST group (config->rejoin).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "bootstrap.hpp"
#include "bounded_exchange.hpp"
#include "collective_step.hpp"
#include "moe_ep_c.h"
#include "store/rank_failure.hpp"

struct moe_ep_handle_s;

namespace moe_ep {

// config's failure fields, checked (INVALID_ARGUMENT naming the field).
struct FailureConfig {
  int32_t policy = MOE_EP_ON_FAILURE_FAIL_HANDLE;
  bool rejoin = false;
  std::string store_address;  // "" when none
  std::string store_prefix;   // "moe_ep" when NULL
};
FailureConfig read_failure_config(const moe_ep_config_t& config);

// Create, failure_policy MASK: connects every rank to the store, agrees on the
// group's key in it (over the bootstrap, still alive at create), and builds
// the HOST backend over the store, or the NVLINK_TWO_SIDED backend (over the
// bootstrap, agreeing through the store after create).  Collective over
// `exchange`.
std::unique_ptr<Backend> make_masking_backend(const Bootstrap& bootstrap, const Exchange& exchange, moe_ep_handle_s& h,
                                              const FailureConfig& failure, const std::vector<RankValue>& fingerprint);

// Create with config->rejoin: a replacement joins its group through the
// store, without the bootstrap's callbacks.  `fingerprint` builds the values
// the survivors compare from the handle's layout and config.
moe_ep_handle_s* create_rejoining_handle(const moe_ep_bootstrap_t* bootstrap, const moe_ep_params_t* params,
                                         const moe_ep_config_t* config);

// Runs one call of a MASK handle: a failure the survivors agreed on
// (RankFailure) ends every pair in flight and updates the handle's mask,
// then goes on to the caller (TIMEOUT, the handle still usable).
template <typename Call>
void survive(moe_ep_handle_s& h, Call&& call);

// The handle's copy of the mask, from the backend's mirror (MASK handles).
void sync_mask(moe_ep_handle_s& h);
void end_pairs_after_failure(moe_ep_handle_s& h, const RankFailure& f);

template <typename Call>
void survive(moe_ep_handle_s& h, Call&& call) {
  try {
    call();
  } catch (const RankFailure& f) {
    end_pairs_after_failure(h, f);
    throw;
  }
}

}  // namespace moe_ep
