#include "tensor_check.hpp"

#include <sstream>

#include "checked_math.hpp"
#include "dtype.hpp"
#include "error.hpp"

namespace moe_ep {

std::string shape_string(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string device_string(const moe_ep_device_t& d) {
  switch (d.device_type) {
    case MOE_EP_DEVICE_CPU: return "cpu";
    case MOE_EP_DEVICE_CUDA: return "cuda:" + std::to_string(d.device_id);
    case MOE_EP_DEVICE_CUDA_HOST: return "cuda_host";
    default: return "device_type " + std::to_string(d.device_type) + " id " + std::to_string(d.device_id);
  }
}

bool device_matches(const moe_ep_device_t& expected, const moe_ep_device_t& actual) {
  if (expected.device_type == MOE_EP_DEVICE_CPU) {
    return actual.device_type == MOE_EP_DEVICE_CPU || actual.device_type == MOE_EP_DEVICE_CUDA_HOST;
  }
  return actual.device_type == expected.device_type && actual.device_id == expected.device_id;
}

std::vector<int64_t> tensor_shape(const moe_ep_tensor_t& t, const std::string& name) {
  if (t.ndim < 0 || t.ndim > 8) fail_argument(name + "->ndim", "0..8", t.ndim);
  if (t.ndim > 0 && t.shape == nullptr) fail_argument(name + "->shape", "a non-NULL array", "NULL");
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

namespace {

std::string shapes_string(const std::vector<std::vector<int64_t>>& shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? " or " : "") + shape_string(shapes[i]);
  return s;
}

int64_t element_count(const std::vector<int64_t>& shape, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : shape) n = checked_mul(n, d, name + " element count");
  return n;
}

// data + byte_offset, checked: the tensor's bytes must not wrap around the
// address space, and its first element must be aligned for its dtype (the
// backends load int32, float, bf16 and fp16 elements directly).
void* checked_start(const moe_ep_tensor_t& t, const std::string& name, const moe_ep_dtype_t& dtype, int64_t n) {
  const uint64_t base = reinterpret_cast<uintptr_t>(t.data);
  uint64_t start = 0, end = 0;
  const uint64_t bytes = dtype_row_bytes(dtype, n);
  if (!try_add(base, t.byte_offset, &start) || !try_add(start, bytes, &end)) {
    fail_argument(name + "->byte_offset", "data + byte_offset + " + std::to_string(bytes) +
                      " bytes within the address space", t.byte_offset);
  }
  const uint64_t alignment = dtype.bits >= 8 ? static_cast<uint64_t>(dtype.bits / 8) : 1;
  if (alignment > 1 && (alignment & (alignment - 1)) == 0 && start % alignment != 0) {
    fail_argument(name + " data + byte_offset", "aligned to " + std::to_string(alignment) + " bytes for " +
                      dtype_name(dtype), "an address " + std::to_string(start % alignment) + " bytes past it");
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(start));
}

void check_compact(const moe_ep_tensor_t& t, const std::vector<int64_t>& shape, const std::string& name) {
  if (t.strides == nullptr || element_count(shape, name) == 0) return;
  int64_t expected = 1;
  std::vector<int64_t> compact(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    compact[i] = expected;
    expected = checked_mul(expected, shape[i], name + " strides");
  }
  for (size_t i = 0; i < shape.size(); ++i) {
    // A dimension of extent 1 is never stepped over: its stride does not matter.
    if (shape[i] != 1 && t.strides[i] != compact[i]) {
      fail_argument(name + "->strides", "compact row-major " + shape_string(compact) + " or NULL",
                    shape_string(std::vector<int64_t>(t.strides, t.strides + t.ndim)));
    }
  }
}

}  // namespace

void* check_tensor(const moe_ep_tensor_t* t, const std::string& name, const moe_ep_dtype_t& dtype,
                   const std::vector<std::vector<int64_t>>& shapes, const moe_ep_device_t& device) {
  if (t == nullptr) fail_argument(name, "a tensor", "NULL");
  const std::vector<int64_t> shape = tensor_shape(*t, name);
  bool shape_ok = false;
  for (const auto& s : shapes) shape_ok = shape_ok || s == shape;
  if (!shape_ok) fail_argument(name + " shape", shapes_string(shapes), shape_string(shape));
  if (t->dtype != dtype) fail_argument(name + " dtype", dtype_name(dtype), dtype_name(t->dtype));
  if (!device_matches(device, t->device)) {
    fail_argument(name + " device", device_string(device), device_string(t->device));
  }
  check_compact(*t, shape, name);
  const int64_t n = element_count(shape, name);
  if (n > 0 && t->data == nullptr) fail_argument(name + "->data", "non-NULL for " + std::to_string(n) + " elements", "NULL");
  if (t->data == nullptr) return nullptr;
  return checked_start(*t, name, dtype, n);
}

}  // namespace moe_ep
