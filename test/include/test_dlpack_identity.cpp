// moe_ep_tensor_t is binary-identical to DLPack's DLTensor (docs/semantics.md §3): same
// size, alignment and field offsets, checked against the real dlpack.h at
// compile time, and a DLTensor passed through the API is read correctly.
#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdio>
#include <cstring>

#include "moe_ep_c.h"

#define SAME_OFFSET(a, b) static_assert(offsetof(moe_ep_tensor_t, a) == offsetof(DLTensor, b), #a)
static_assert(sizeof(moe_ep_tensor_t) == sizeof(DLTensor), "size");
static_assert(alignof(moe_ep_tensor_t) == alignof(DLTensor), "alignment");
SAME_OFFSET(data, data);
SAME_OFFSET(device, device);
SAME_OFFSET(ndim, ndim);
SAME_OFFSET(dtype, dtype);
SAME_OFFSET(shape, shape);
SAME_OFFSET(strides, strides);
SAME_OFFSET(byte_offset, byte_offset);
static_assert(sizeof(moe_ep_device_t) == sizeof(DLDevice), "device size");
static_assert(offsetof(moe_ep_device_t, device_type) == offsetof(DLDevice, device_type), "device_type");
static_assert(offsetof(moe_ep_device_t, device_id) == offsetof(DLDevice, device_id), "device_id");
static_assert(sizeof(moe_ep_dtype_t) == sizeof(DLDataType), "dtype size");
static_assert(offsetof(moe_ep_dtype_t, code) == offsetof(DLDataType, code), "code");
static_assert(offsetof(moe_ep_dtype_t, bits) == offsetof(DLDataType, bits), "bits");
static_assert(offsetof(moe_ep_dtype_t, lanes) == offsetof(DLDataType, lanes), "lanes");
constexpr int as_int(int v) { return v; }
static_assert(as_int(MOE_EP_DEVICE_CPU) == as_int(kDLCPU), "kDLCPU");
static_assert(as_int(MOE_EP_DEVICE_CUDA) == as_int(kDLCUDA), "kDLCUDA");
static_assert(as_int(MOE_EP_DEVICE_CUDA_HOST) == as_int(kDLCUDAHost), "kDLCUDAHost");
static_assert(as_int(MOE_EP_DTYPE_INT) == as_int(kDLInt), "kDLInt");
static_assert(as_int(MOE_EP_DTYPE_UINT) == as_int(kDLUInt), "kDLUInt");
static_assert(as_int(MOE_EP_DTYPE_FLOAT) == as_int(kDLFloat), "kDLFloat");
static_assert(as_int(MOE_EP_DTYPE_BFLOAT) == as_int(kDLBfloat), "kDLBfloat");

extern "C" int moe_ep_test_header_c99(void);
extern "C" int moe_ep_test_header_c11(void);
int moe_ep_test_header_cxx();

int main() {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::printf("FAILED: %s\n", what);
      ++failures;
    }
  };
  // Field-by-field round trip through memory: what a framework writes is what we read.
  int64_t shape[2] = {3, 5};
  int64_t strides[2] = {5, 1};
  float storage[15];
  DLTensor dl;
  dl.data = storage;
  dl.device.device_type = kDLCPU;
  dl.device.device_id = 7;
  dl.ndim = 2;
  dl.dtype.code = kDLFloat;
  dl.dtype.bits = 32;
  dl.dtype.lanes = 1;
  dl.shape = shape;
  dl.strides = strides;
  dl.byte_offset = 12;
  moe_ep_tensor_t t;
  std::memcpy(&t, &dl, sizeof(t));
  expect(t.data == storage, "data");
  expect(t.device.device_type == MOE_EP_DEVICE_CPU && t.device.device_id == 7, "device");
  expect(t.ndim == 2 && t.shape == shape && t.strides == strides, "shape/strides");
  expect(t.dtype.code == MOE_EP_DTYPE_FLOAT && t.dtype.bits == 32 && t.dtype.lanes == 1, "dtype");
  expect(t.byte_offset == 12, "byte_offset");
  // The library's own view of sizes matches the header we compiled against.
  int32_t major = -1, minor = -1, patch = -1;
  expect(moe_ep_get_version(&major, &minor, &patch) == MOE_EP_SUCCESS, "get_version status");
  expect(major == MOE_EP_VERSION_MAJOR && minor == MOE_EP_VERSION_MINOR && patch == MOE_EP_VERSION_PATCH,
         "runtime version equals header version");
  expect(moe_ep_test_header_c99() > 0 && moe_ep_test_header_c11() > 0 && moe_ep_test_header_cxx() > 0, "C and C++ translation units linked");
  std::printf("%s\n", failures ? "abi layout: FAILED" : "abi layout: OK");
  return failures ? 1 : 0;
}
