// Parameter and configuration builders shared by the unit tests.
#pragma once

#include "moe_ep_c.h"

namespace moe_ep_test {

// Defaults from moe_ep_params_init with the required fields filled in.
inline moe_ep_params_t make_params(int32_t num_experts, int32_t top_k, int32_t max_tokens_per_rank,
                                   int32_t hidden_size) {
  moe_ep_params_t p;
  moe_ep_params_init(&p);
  p.num_experts = num_experts;
  p.top_k = top_k;
  p.max_tokens_per_rank = max_tokens_per_rank;
  p.hidden_size = hidden_size;
  return p;
}

// Defaults from moe_ep_config_init with the HOST backend.
inline moe_ep_config_t host_config() {
  moe_ep_config_t c;
  moe_ep_config_init(&c);
  c.backend = MOE_EP_BACKEND_HOST;
  return c;
}

}  // namespace moe_ep_test
