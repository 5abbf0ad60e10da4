// Parameter and configuration builders shared by the unit tests.
#pragma once

#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_test {

// Defaults from moe_ep_params_init with the required fields filled in.
inline moe_ep_params_t make_params(int32_t num_experts, int32_t top_k, int32_t max_tokens_per_rank,
                                   int32_t hidden_size) {
  return moe_ep_verify::required_params(num_experts, top_k, max_tokens_per_rank, hidden_size);
}

// Defaults from moe_ep_config_init with the HOST backend.
inline moe_ep_config_t host_config() {
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  c.backend = MOE_EP_BACKEND_HOST;
  return c;
}

}  // namespace moe_ep_test
