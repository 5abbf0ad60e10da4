// Validation of caller tensors against the shape, dtype and device a call
// expects, with messages that name the argument, the expected and the actual.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep {

std::string shape_string(const std::vector<int64_t>& shape);
std::string device_string(const moe_ep_device_t& device);

// Shape of a tensor as a vector (ndim entries); throws if shape is NULL.
std::vector<int64_t> tensor_shape(const moe_ep_tensor_t& t, const std::string& name);

// Checks a required tensor and returns data + byte_offset (NULL allowed only
// when the tensor has no elements).  `shapes` lists the accepted shapes.
void* check_tensor(const moe_ep_tensor_t* t, const std::string& name, const moe_ep_dtype_t& dtype,
                   const std::vector<std::vector<int64_t>>& shapes, const moe_ep_device_t& device);

// Whether `actual` is acceptable where `expected` is the backend's device
// (CPU memory accepts kDLCPU and kDLCUDAHost; CUDA needs the same ordinal).
bool device_matches(const moe_ep_device_t& expected, const moe_ep_device_t& actual);

}  // namespace moe_ep
