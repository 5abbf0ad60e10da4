/* Prints the layout of every public struct of moe_ep_c.h as seen by the C
 * compiler, one line per field:
 *     <struct> <field> <offset> <size>
 * and one line per struct:
 *     <struct> sizeof <size> <alignment>
 * The Rust (moe-ep-sys) and Python (ctypes) bindings declare these structs by
 * hand; their tests compare their own layout against this output, so that a
 * field added to the header without updating a binding fails a test. */
#include <stddef.h>
#include <stdio.h>

#include "moe_ep_c.h"

#define ALIGNOF(T) offsetof(struct { char c; T t; }, t)
#define FIELD(T, f) printf("%s %s %zu %zu\n", #T, #f, offsetof(T, f), sizeof(((T*)0)->f))
#define STRUCT(T) printf("%s sizeof %zu %zu\n", #T, sizeof(T), ALIGNOF(T))

int main(void) {
  STRUCT(moe_ep_device_t);
  FIELD(moe_ep_device_t, device_type);
  FIELD(moe_ep_device_t, device_id);

  STRUCT(moe_ep_dtype_t);
  FIELD(moe_ep_dtype_t, code);
  FIELD(moe_ep_dtype_t, bits);
  FIELD(moe_ep_dtype_t, lanes);

  STRUCT(moe_ep_tensor_t);
  FIELD(moe_ep_tensor_t, data);
  FIELD(moe_ep_tensor_t, device);
  FIELD(moe_ep_tensor_t, ndim);
  FIELD(moe_ep_tensor_t, dtype);
  FIELD(moe_ep_tensor_t, shape);
  FIELD(moe_ep_tensor_t, strides);
  FIELD(moe_ep_tensor_t, byte_offset);

  STRUCT(moe_ep_bootstrap_t);
  FIELD(moe_ep_bootstrap_t, struct_size);
  FIELD(moe_ep_bootstrap_t, rank);
  FIELD(moe_ep_bootstrap_t, world_size);
  FIELD(moe_ep_bootstrap_t, ctx);
  FIELD(moe_ep_bootstrap_t, allgather);
  FIELD(moe_ep_bootstrap_t, barrier);

  STRUCT(moe_ep_params_t);
  FIELD(moe_ep_params_t, struct_size);
  FIELD(moe_ep_params_t, num_experts);
  FIELD(moe_ep_params_t, top_k);
  FIELD(moe_ep_params_t, max_tokens_per_rank);
  FIELD(moe_ep_params_t, hidden_size);
  FIELD(moe_ep_params_t, hidden_dtype);
  FIELD(moe_ep_params_t, hidden_row_elems);
  FIELD(moe_ep_params_t, scale_row_elems);
  FIELD(moe_ep_params_t, scale_dtype);
  FIELD(moe_ep_params_t, invalid_expert_id);
  FIELD(moe_ep_params_t, enable_eplb_stats);
  FIELD(moe_ep_params_t, combine_dtype);

  STRUCT(moe_ep_config_t);
  FIELD(moe_ep_config_t, struct_size);
  FIELD(moe_ep_config_t, backend);
  FIELD(moe_ep_config_t, num_sms);
  FIELD(moe_ep_config_t, timeout_ms);
  FIELD(moe_ep_config_t, device);
  FIELD(moe_ep_config_t, zero_copy_combine);
  FIELD(moe_ep_config_t, micro_batches);
  FIELD(moe_ep_config_t, failure_policy);
  FIELD(moe_ep_config_t, rejoin);
  FIELD(moe_ep_config_t, store_address);
  FIELD(moe_ep_config_t, store_prefix);

  STRUCT(moe_ep_dispatch_args_t);
  FIELD(moe_ep_dispatch_args_t, struct_size);
  FIELD(moe_ep_dispatch_args_t, hidden_states);
  FIELD(moe_ep_dispatch_args_t, topk_ids);
  FIELD(moe_ep_dispatch_args_t, topk_weights);
  FIELD(moe_ep_dispatch_args_t, hidden_states_scale);
  FIELD(moe_ep_dispatch_args_t, runtime_max_tokens_per_rank);
  FIELD(moe_ep_dispatch_args_t, eplb_local_stats);

  STRUCT(moe_ep_dispatch_result_t);
  FIELD(moe_ep_dispatch_result_t, struct_size);
  FIELD(moe_ep_dispatch_result_t, tokens_per_rank);
  FIELD(moe_ep_dispatch_result_t, hidden_states);
  FIELD(moe_ep_dispatch_result_t, topk_ids);
  FIELD(moe_ep_dispatch_result_t, topk_weights);
  FIELD(moe_ep_dispatch_result_t, hidden_states_scale);
  FIELD(moe_ep_dispatch_result_t, recv_counts);
  FIELD(moe_ep_dispatch_result_t, local_expert_counts);
  FIELD(moe_ep_dispatch_result_t, eplb_gathered_stats);
  FIELD(moe_ep_dispatch_result_t, combine_input);

  STRUCT(moe_ep_combine_result_t);
  FIELD(moe_ep_combine_result_t, struct_size);
  FIELD(moe_ep_combine_result_t, output);

  STRUCT(moe_ep_health_t);
  FIELD(moe_ep_health_t, struct_size);
  FIELD(moe_ep_health_t, status);
  FIELD(moe_ep_health_t, failed_rank);
  FIELD(moe_ep_health_t, active_count);
  FIELD(moe_ep_health_t, mask_epoch);
  return 0;
}
