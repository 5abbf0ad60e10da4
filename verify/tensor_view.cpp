#include "tensor_view.hpp"

#include <stdexcept>

#include "dtypes.hpp"

namespace moe_ep_verify {

TensorView::TensorView(const void* data, const moe_ep_dtype_t& dtype, std::initializer_list<int64_t> dims,
                       const moe_ep_device_t& device) {
  if (dims.size() > kMaxDims) throw std::invalid_argument("TensorView: more than 4 dimensions");
  int i = 0;
  for (int64_t d : dims) shape_[i++] = d;
  view_.data = const_cast<void*>(data);  // the C API takes void*; inputs are only read
  view_.device = device;
  view_.ndim = i;
  view_.dtype = dtype;
  view_.strides = nullptr;
  view_.byte_offset = 0;
}

DispatchMemory host_memory(const RankInputs& in) {
  return DispatchMemory{in.hidden.data(), in.routing.topk_ids.data(), in.routing.topk_weights.data(), in.scales.data(),
                        in.eplb_local.data()};
}

DispatchArgs::DispatchArgs(const WorkloadSpec& s, int num_tokens, const DispatchMemory& m,
                           const moe_ep_device_t& device)
    : hidden_(m.hidden, s.hidden_dtype, {num_tokens, s.row_elems()}, device),
      ids_(m.topk_ids, int32_dtype(), {num_tokens, s.top_k}, device),
      weights_(m.topk_weights, fp32_dtype(), {num_tokens, s.top_k}, device),
      scales_(m.scales, s.scale_dtype, {num_tokens, s.scale_row_elems}, device),
      eplb_(m.eplb_local, int32_dtype(), {s.num_experts}, device),
      weights_on_(s.weights),
      scales_on_(s.scale_row_elems != 0),
      eplb_on_(s.eplb_given),
      runtime_max_(s.runtime_max_tokens_per_rank) {}

const moe_ep_dispatch_args_t* DispatchArgs::get() {
  moe_ep_dispatch_args_init(&args_, sizeof args_);
  args_.hidden_states = hidden_.get();
  args_.topk_ids = ids_.get();
  args_.topk_weights = weights_on_ ? weights_.get() : nullptr;
  args_.hidden_states_scale = scales_on_ ? scales_.get() : nullptr;
  args_.runtime_max_tokens_per_rank = runtime_max_;
  args_.eplb_local_stats = eplb_on_ ? eplb_.get() : nullptr;
  return &args_;
}

TensorView expert_output_view(const WorkloadSpec& s, const void* data, const moe_ep_device_t& device, bool as_3d) {
  if (s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR && as_3d) {
    return TensorView(data, s.combine_dtype, {s.experts_per_rank(), s.capacity(), s.hidden_size}, device);
  }
  if (s.expert_layout()) return TensorView(data, s.combine_dtype, {s.expert_layout_rows(), s.hidden_size}, device);
  if (as_3d) return TensorView(data, s.combine_dtype, {s.world, s.tokens_per_rank(), s.hidden_size}, device);
  return TensorView(data, s.combine_dtype, {s.receive_rows(), s.hidden_size}, device);
}

TensorView combine_output_view(const WorkloadSpec& s, void* data, int num_tokens, const moe_ep_device_t& device) {
  return TensorView(data, s.combine_dtype, {num_tokens, s.hidden_size}, device);
}

}  // namespace moe_ep_verify
