// Parameter, configuration and tensor builders shared by the unit tests.
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

// A row-major CPU tensor over `data` (the HOST backend's inputs and outputs).
inline moe_ep_tensor_t cpu_tensor(void* data, moe_ep_dtype_t dtype, int64_t* shape, int32_t ndim) {
  moe_ep_tensor_t t{};
  t.data = data;
  t.device = moe_ep_device_t{MOE_EP_DEVICE_CPU, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

}  // namespace moe_ep_test
