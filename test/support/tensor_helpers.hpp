// Small helpers to describe host buffers as moe_ep_tensor_t in tests.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep_test {

// A tensor view that owns its shape array.  Not copyable: the view points into it.
class TensorRef {
 public:
  TensorRef(const void* data, moe_ep_dtype_t dtype, std::vector<int64_t> shape,
            moe_ep_device_t device = moe_ep_device_t{MOE_EP_DEVICE_CPU, 0})
      : shape_(std::move(shape)) {
    t_ = moe_ep_tensor_t{};
    t_.data = const_cast<void*>(data);
    t_.device = device;
    t_.ndim = static_cast<int32_t>(shape_.size());
    t_.dtype = dtype;
    t_.shape = shape_.data();
  }
  TensorRef(const TensorRef&) = delete;
  TensorRef& operator=(const TensorRef&) = delete;

  const moe_ep_tensor_t* get() const { return &t_; }
  moe_ep_tensor_t& raw() { return t_; }
  std::vector<int64_t>& shape() { return shape_; }

 private:
  std::vector<int64_t> shape_;
  moe_ep_tensor_t t_;
};

inline moe_ep_dtype_t int32_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}; }
inline moe_ep_dtype_t fp32_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1}; }
inline moe_ep_dtype_t fp16_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 16, 1}; }
inline moe_ep_dtype_t bf16_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}; }
inline moe_ep_dtype_t uint8_dtype() { return moe_ep_dtype_t{MOE_EP_DTYPE_UINT, 8, 1}; }

}  // namespace moe_ep_test
