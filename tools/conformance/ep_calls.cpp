#include "ep_calls.hpp"

#include "errors.hpp"
#include "expert_rows.hpp"

namespace moe_ep_tool {

EpHandle::EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params,
                   const moe_ep_config_t& config) {
  TOOL_CHECK_MOE(moe_ep_create(&bootstrap, &params, &config, &handle_));
}

EpHandle::EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params, const moe_ep_config_t& config,
                   moe_ep_status_t tolerated, moe_ep_status_t* status) {
  *status = moe_ep_create(&bootstrap, &params, &config, &handle_);
  if (*status != tolerated) TOOL_CHECK_MOE(*status);
}

EpHandle::~EpHandle() {
  // Collective like create; a failure here cannot be reported from a destructor
  // and leaves nothing behind that matters to the results.
  moe_ep_destroy(&handle_);
}

DispatchInputs::DispatchInputs(const WorkloadSpec& s, const Place& place)
    : place_(place),
      hidden_(place, uint64_t(s.max_tokens_per_rank) * s.hidden_row_bytes()),
      ids_(place, uint64_t(s.max_tokens_per_rank) * s.top_k * sizeof(int32_t)),
      weights_(place, uint64_t(s.max_tokens_per_rank) * s.top_k * sizeof(float)),
      scales_(place, uint64_t(s.max_tokens_per_rank) * s.scale_row_bytes()),
      eplb_(place, uint64_t(s.num_experts) * sizeof(int32_t)) {}

void DispatchInputs::load(const WorkloadSpec& s, int rank, const RankRouting& routing, void* stream) {
  num_tokens_ = routing.num_tokens;
  hidden_.upload(make_hidden(s, rank), stream);
  ids_.upload(routing.topk_ids, stream);
  weights_.upload(routing.topk_weights, stream);
  if (s.scale_row_elems) scales_.upload(make_scales(s, rank), stream);
  if (s.eplb_given) eplb_.upload(make_eplb_local(s, rank), stream);
}

moe_ep_status_t DispatchInputs::dispatch(moe_ep_handle_t handle, const WorkloadSpec& s,
                                         moe_ep_dispatch_result_t* result, void* stream) {
  const DispatchMemory memory{hidden_.data(), ids_.data(), weights_.data(), scales_.data(), eplb_.data()};
  DispatchArgs args(s, num_tokens_, memory, place_.dlpack());
  TOOL_CHECK_MOE(moe_ep_dispatch_result_init(result, sizeof *result));
  return moe_ep_dispatch(handle, args.get(), result, stream);
}

moe_ep_status_t DispatchInputs::dispatch_send(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& s,
                                              void* stream) {
  const DispatchMemory memory{hidden_.data(), ids_.data(), weights_.data(), scales_.data(), eplb_.data()};
  DispatchArgs args(s, num_tokens_, memory, place_.dlpack());
  return moe_ep_dispatch_send(handle, slot, args.get(), stream);
}

moe_ep_status_t run_combine_send(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& s, const Place& place,
                                 const void* expert_output, bool as_3d, void* stream) {
  const TensorView input = expert_output_view(s, expert_output, place.dlpack(), as_3d);
  return moe_ep_combine_send(handle, slot, input.get(), stream);
}

moe_ep_status_t run_combine_recv(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& s, const Place& place,
                                 const Buffer* output, int num_tokens, moe_ep_combine_result_t* result, void* stream) {
  const TensorView out = combine_output_view(s, output ? output->data() : nullptr, num_tokens, place.dlpack());
  TOOL_CHECK_MOE(moe_ep_combine_result_init(result, sizeof *result));
  return moe_ep_combine_recv(handle, slot, output ? out.get() : nullptr, result, stream);
}

moe_ep_status_t run_combine(moe_ep_handle_t handle, const WorkloadSpec& s, const Place& place,
                            const void* expert_output, bool as_3d, const Buffer* output, int num_tokens,
                            moe_ep_combine_result_t* result, void* stream) {
  const TensorView input = expert_output_view(s, expert_output, place.dlpack(), as_3d);
  const TensorView out = combine_output_view(s, output ? output->data() : nullptr, num_tokens, place.dlpack());
  TOOL_CHECK_MOE(moe_ep_combine_result_init(result, sizeof *result));
  return moe_ep_combine(handle, input.get(), output ? out.get() : nullptr, result, stream);
}

moe_ep_config_t with_zero_copy_combine(moe_ep_config_t config, bool zero_copy) {
  config.zero_copy_combine = zero_copy ? 1 : 0;
  return config;
}

void* fill_combine_input(const WorkloadSpec& s, int rank, const Place& place, const moe_ep_dispatch_result_t& r,
                         void* stream, const std::vector<RankRouting>* all) {
  const int64_t P = s.combine_rows();  // receive rows, or the expert layout's rows
  int64_t view_rows = r.combine_input.ndim >= 2 && r.combine_input.shape ? r.combine_input.shape[0] : -1;
  if (view_rows >= 0 && r.combine_input.ndim == 3) view_rows *= r.combine_input.shape[1];  // [E_local, capacity, H]
  if (r.combine_input.data == nullptr || view_rows != P ||
      r.combine_input.shape[r.combine_input.ndim - 1] != s.hidden_size) {
    fail("zero-copy combine: the dispatch result has no [" + std::to_string(P) + ", " + std::to_string(s.hidden_size) +
         "] combine_input view (config->zero_copy_combine was set)");
  }
  if (all != nullptr && s.expert_layout()) {
    write_expert_layout_output(s, rank, *all, place, r.combine_input.data, stream);
    return r.combine_input.data;
  }
  const std::vector<uint8_t> rows = make_expert_output(s, rank);
  upload_at(place, r.combine_input.data, rows.data(), rows.size(), stream);
  return r.combine_input.data;
}

void poison_dispatch_payload(const WorkloadSpec& s, const Place& place, const moe_ep_dispatch_result_t& r,
                             void* stream) {
  const uint64_t P = uint64_t(s.expert_layout() ? s.expert_layout_rows() : s.receive_rows());
  fill_at(place, r.hidden_states.data, P * s.recv_hidden_row_bytes(), 0xA5, stream);  // as received (FP8 wire: e4m3)
  uint64_t scale_bytes = P * s.recv_scale_row_bytes();
  if (s.expert_layout() && s.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) {  // fp32 columns of rows rounded up to 4
    const uint64_t column = s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR ? (uint64_t(s.capacity()) + 3) / 4 * 4
                                                                           : (uint64_t(P) + 3) / 4 * 4;
    const uint64_t columns = uint64_t(s.recv_scale_row_elems()) *
                             (s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR ? uint64_t(s.experts_per_rank()) : 1);
    scale_bytes = columns * column * sizeof(float);
  }
  if (s.recv_scale_row_elems()) fill_at(place, r.hidden_states_scale.data, scale_bytes, 0xA5, stream);
}

}  // namespace moe_ep_tool
