// Memory described as moe_ep_tensor_t views, for every caller of the C API in
// the tests and in moe_ep_conformance: one view class, the dispatch arguments
// of a workload, and the combine inputs.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_verify {

inline moe_ep_device_t host_device() { return moe_ep_device_t{MOE_EP_DEVICE_CPU, 0}; }

// A compact view that owns its shape.  Copies are safe: get() and raw() aim
// the shape pointer at the object they are called on.
class TensorView {
 public:
  static constexpr int kMaxDims = 4;
  TensorView(const void* data, const moe_ep_dtype_t& dtype, std::initializer_list<int64_t> dims,
             const moe_ep_device_t& device = host_device());

  const moe_ep_tensor_t* get() const {
    view_.shape = shape_;
    return &view_;
  }
  moe_ep_tensor_t& raw() {  // for tests that spoil one field
    view_.shape = shape_;
    return view_;
  }
  int64_t* shape() { return shape_; }

 private:
  mutable moe_ep_tensor_t view_{};
  mutable int64_t shape_[kMaxDims] = {};  // mutable: the view points at it
};

// Where one rank's dispatch inputs are (host or device addresses).
struct DispatchMemory {
  const void* hidden = nullptr;        // [T, row bytes]
  const void* topk_ids = nullptr;      // [T, K] int32
  const void* topk_weights = nullptr;  // [T, K] fp32
  const void* scales = nullptr;        // [T, scale row bytes]
  const void* eplb_local = nullptr;    // [E] int32
};
// The host copies of make_rank_inputs, where they are.
DispatchMemory host_memory(const RankInputs& inputs);

// The dispatch arguments of `spec` over that memory: weights, scales and
// eplb_local_stats are passed exactly when the spec asks for them.
class DispatchArgs {
 public:
  DispatchArgs(const WorkloadSpec& spec, int num_tokens, const DispatchMemory& memory,
               const moe_ep_device_t& device = host_device());
  const moe_ep_dispatch_args_t* get();

 private:
  TensorView hidden_, ids_, weights_, scales_, eplb_;
  bool weights_on_, scales_on_, eplb_on_;
  int32_t runtime_max_;
  moe_ep_dispatch_args_t args_{};
};

// combine's expert_output: [world * tpr, H], or [world, tpr, H] with as_3d; in
// an expert layout [E_local * capacity, H] or [E_local, capacity, H] with
// as_3d (EXPERT_MAJOR), [expert_rows, H] (EXPERT_PACKED).
TensorView expert_output_view(const WorkloadSpec& spec, const void* data, const moe_ep_device_t& device,
                              bool as_3d = false);
// combine's caller-owned output: [num_tokens, H] of combine_dtype.
TensorView combine_output_view(const WorkloadSpec& spec, void* data, int num_tokens, const moe_ep_device_t& device);

}  // namespace moe_ep_verify
