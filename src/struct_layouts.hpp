// The released layouts of the public versioned structs: for each struct, the
// struct_size values a caller may pass.
//
// Rule: a struct_size is valid if it ends exactly where a field of a released
// layout ends (fields after struct_size; appending a field never moves the
// earlier ones, so the current field list covers every older layout), or if it
// is the sizeof of a released layout (which may add tail padding).  A size that
// ends inside a field (args.struct_size = 12 cuts a pointer in half) is
// rejected.  A larger size, from a newer header, is accepted if it is a
// multiple of the struct's alignment (every sizeof is) and at most
// kMaxStructSize; the bytes this library does not know must then be zero.
//
// When a field is added to a struct: append its end to `field_ends` and keep
// the old sizeof in `released_sizes`.
#pragma once

#include <cstddef>
#include <cstdint>

#include "moe_ep_c.h"

namespace moe_ep {

// No public struct will ever need more; a bigger struct_size is a bug (or an
// attack) and is never read.
constexpr uint32_t kMaxStructSize = 1024;

#define MOE_EP_FIELD_END(T, field) (offsetof(T, field) + sizeof(static_cast<T*>(nullptr)->field))

template <typename T>
struct StructLayout;  // specialised for every public versioned struct

template <>
struct StructLayout<moe_ep_bootstrap_t> {
  using T = moe_ep_bootstrap_t;
  static constexpr const char* c_name = "moe_ep_bootstrap_t";
  static constexpr const char* init_name = "moe_ep_bootstrap_init";
  static constexpr size_t field_ends[] = {MOE_EP_FIELD_END(T, rank), MOE_EP_FIELD_END(T, world_size),
                                          MOE_EP_FIELD_END(T, ctx), MOE_EP_FIELD_END(T, allgather),
                                          MOE_EP_FIELD_END(T, barrier)};
  static constexpr size_t released_sizes[] = {sizeof(T)};  // 0.1
};

template <>
struct StructLayout<moe_ep_params_t> {
  using T = moe_ep_params_t;
  static constexpr const char* c_name = "moe_ep_params_t";
  static constexpr const char* init_name = "moe_ep_params_init";
  static constexpr size_t field_ends[] = {
      MOE_EP_FIELD_END(T, num_experts),         MOE_EP_FIELD_END(T, top_k),
      MOE_EP_FIELD_END(T, max_tokens_per_rank), MOE_EP_FIELD_END(T, hidden_size),
      MOE_EP_FIELD_END(T, hidden_dtype),        MOE_EP_FIELD_END(T, hidden_row_elems),
      MOE_EP_FIELD_END(T, scale_row_elems),     MOE_EP_FIELD_END(T, scale_dtype),
      MOE_EP_FIELD_END(T, invalid_expert_id),   MOE_EP_FIELD_END(T, enable_eplb_stats),
      MOE_EP_FIELD_END(T, combine_dtype),       MOE_EP_FIELD_END(T, receive_layout),
      MOE_EP_FIELD_END(T, expert_capacity),     MOE_EP_FIELD_END(T, expert_alignment),
      MOE_EP_FIELD_END(T, expert_rows),         MOE_EP_FIELD_END(T, expert_output_weighted),
      MOE_EP_FIELD_END(T, scale_layout),        MOE_EP_FIELD_END(T, dispatch_wire),
      MOE_EP_FIELD_END(T, combine_wire),        MOE_EP_FIELD_END(T, wire_scale),
      MOE_EP_FIELD_END(T, dispatch_dequantize)};
  // 0.1 ended at combine_dtype; the receive layout fields, then the wire
  // fields were appended after 0.1.
  static constexpr size_t released_sizes[] = {MOE_EP_FIELD_END(T, combine_dtype), MOE_EP_FIELD_END(T, scale_layout),
                                              sizeof(T)};
};

template <>
struct StructLayout<moe_ep_config_t> {
  using T = moe_ep_config_t;
  static constexpr const char* c_name = "moe_ep_config_t";
  static constexpr const char* init_name = "moe_ep_config_init";
  static constexpr size_t field_ends[] = {MOE_EP_FIELD_END(T, backend),           MOE_EP_FIELD_END(T, num_sms),
                                          MOE_EP_FIELD_END(T, timeout_ms),        MOE_EP_FIELD_END(T, device),
                                          MOE_EP_FIELD_END(T, zero_copy_combine), MOE_EP_FIELD_END(T, micro_batches),
                                          MOE_EP_FIELD_END(T, failure_policy),    MOE_EP_FIELD_END(T, rejoin),
                                          MOE_EP_FIELD_END(T, store_address),     MOE_EP_FIELD_END(T, store_prefix)};
  // 0.1 ended at device; zero_copy_combine, micro_batches, then the failure
  // fields were appended after 0.1.
  static constexpr size_t released_sizes[] = {MOE_EP_FIELD_END(T, device), MOE_EP_FIELD_END(T, zero_copy_combine),
                                              MOE_EP_FIELD_END(T, micro_batches), sizeof(T)};
};

template <>
struct StructLayout<moe_ep_dispatch_args_t> {
  using T = moe_ep_dispatch_args_t;
  static constexpr const char* c_name = "moe_ep_dispatch_args_t";
  static constexpr const char* init_name = "moe_ep_dispatch_args_init";
  static constexpr size_t field_ends[] = {
      MOE_EP_FIELD_END(T, hidden_states),       MOE_EP_FIELD_END(T, topk_ids),
      MOE_EP_FIELD_END(T, topk_weights),        MOE_EP_FIELD_END(T, hidden_states_scale),
      MOE_EP_FIELD_END(T, runtime_max_tokens_per_rank), MOE_EP_FIELD_END(T, eplb_local_stats)};
  static constexpr size_t released_sizes[] = {sizeof(T)};  // 0.1
};

template <>
struct StructLayout<moe_ep_dispatch_result_t> {
  using T = moe_ep_dispatch_result_t;
  static constexpr const char* c_name = "moe_ep_dispatch_result_t";
  static constexpr const char* init_name = "moe_ep_dispatch_result_init";
  static constexpr size_t field_ends[] = {MOE_EP_FIELD_END(T, tokens_per_rank),
                                          MOE_EP_FIELD_END(T, hidden_states),
                                          MOE_EP_FIELD_END(T, topk_ids),
                                          MOE_EP_FIELD_END(T, topk_weights),
                                          MOE_EP_FIELD_END(T, hidden_states_scale),
                                          MOE_EP_FIELD_END(T, recv_counts),
                                          MOE_EP_FIELD_END(T, local_expert_counts),
                                          MOE_EP_FIELD_END(T, eplb_gathered_stats),
                                          MOE_EP_FIELD_END(T, combine_input),
                                          MOE_EP_FIELD_END(T, expert_counts),
                                          MOE_EP_FIELD_END(T, expert_offsets),
                                          MOE_EP_FIELD_END(T, row_sources),
                                          MOE_EP_FIELD_END(T, row_weights),
                                          MOE_EP_FIELD_END(T, dropped_pairs)};
  // 0.1 ended at eplb_gathered_stats; combine_input, then the expert layout
  // results were appended after 0.1.
  static constexpr size_t released_sizes[] = {MOE_EP_FIELD_END(T, eplb_gathered_stats),
                                              MOE_EP_FIELD_END(T, combine_input), sizeof(T)};
};

template <>
struct StructLayout<moe_ep_combine_result_t> {
  using T = moe_ep_combine_result_t;
  static constexpr const char* c_name = "moe_ep_combine_result_t";
  static constexpr const char* init_name = "moe_ep_combine_result_init";
  static constexpr size_t field_ends[] = {MOE_EP_FIELD_END(T, output)};
  static constexpr size_t released_sizes[] = {sizeof(T)};  // 0.1
};

template <>
struct StructLayout<moe_ep_health_t> {
  using T = moe_ep_health_t;
  static constexpr const char* c_name = "moe_ep_health_t";
  static constexpr const char* init_name = "moe_ep_health_init";
  static constexpr size_t field_ends[] = {MOE_EP_FIELD_END(T, status), MOE_EP_FIELD_END(T, failed_rank),
                                          MOE_EP_FIELD_END(T, active_count), MOE_EP_FIELD_END(T, mask_epoch)};
  static constexpr size_t released_sizes[] = {sizeof(T)};  // 0.1
};

#undef MOE_EP_FIELD_END

}  // namespace moe_ep
