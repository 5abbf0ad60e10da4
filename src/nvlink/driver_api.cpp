#include "nvlink/driver_api.hpp"

#include <cuda_runtime_api.h>

#include <mutex>

#include "error.hpp"

namespace moe_ep {

namespace {

// Driver ABI version the function pointer types above were declared for.
constexpr unsigned kDriverAbiVersion = 12000;

struct Loaded {
  DriverApi api;
  bool ok = false;
  std::string missing;  // why not ok
};

template <typename Fn>
bool load(const char* symbol, Fn* fn, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbiVersion, cudaEnableDefault, &found);
  if (rc != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();  // do not leave a sticky runtime error behind
    if (missing->empty()) {
      *missing = std::string("driver entry point ") + symbol + " unavailable (" +
                 (rc != cudaSuccess ? cudaGetErrorString(rc) : "symbol not found or driver too old") + ")";
    }
    return false;
  }
  *fn = reinterpret_cast<Fn>(p);
  return true;
}

const Loaded& loaded() {
  static Loaded l = [] {
    Loaded x;
    DriverApi& a = x.api;
    std::string& m = x.missing;
    x.ok = load("cuMemCreate", &a.mem_create, &m) & load("cuMemRelease", &a.mem_release, &m) &
           load("cuMemExportToShareableHandle", &a.mem_export, &m) &
           load("cuMemImportFromShareableHandle", &a.mem_import, &m) &
           load("cuMemAddressReserve", &a.address_reserve, &m) & load("cuMemAddressFree", &a.address_free, &m) &
           load("cuMemMap", &a.mem_map, &m) & load("cuMemUnmap", &a.mem_unmap, &m) &
           load("cuMemSetAccess", &a.mem_set_access, &m) &
           load("cuMemGetAllocationGranularity", &a.granularity, &m) & load("cuDeviceGet", &a.device_get, &m) &
           load("cuDeviceGetAttribute", &a.device_attribute, &m) & load("cuGetErrorName", &a.error_name, &m) &
           load("cuGetErrorString", &a.error_string, &m);
    std::string optional_missing;  // not a reason to refuse the backend
    if (!(load("cuStreamWaitValue32", &a.stream_wait_value32, &optional_missing) &
          load("cuStreamWriteValue32", &a.stream_write_value32, &optional_missing))) {
      a.stream_wait_value32 = nullptr;
      a.stream_write_value32 = nullptr;
    }
    return x;
  }();
  return l;
}

}  // namespace

const DriverApi& driver_api() {
  const Loaded& l = loaded();
  if (!l.ok) fail(MOE_EP_ERROR_UNSUPPORTED, "NVLINK_TWO_SIDED needs the CUDA driver's VMM API: ", l.missing);
  return l.api;
}

const DriverApi* try_driver_api() noexcept {
  try {
    const Loaded& l = loaded();
    return l.ok ? &l.api : nullptr;
  } catch (...) {
    return nullptr;
  }
}

std::string driver_error_text(const char* what, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  const DriverApi* api = try_driver_api();
  if (api) {
    api->error_name(result, &name);
    api->error_string(result, &text);
  }
  return std::string(what) + ": " + (name ? name : "CUresult " + std::to_string(static_cast<int>(result))) + " (" +
         (text ? text : "no description") + ")";
}

void check_driver(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  fail(result == CUDA_ERROR_OUT_OF_MEMORY ? MOE_EP_ERROR_OUT_OF_MEMORY : MOE_EP_ERROR_CUDA,
       driver_error_text(what, result));
}

int device_attribute(int device, CUdevice_attribute attribute, const char* name) {
  const DriverApi& api = driver_api();
  CUdevice d = 0;
  check_driver(api.device_get(&d, device), ("cuDeviceGet(" + std::to_string(device) + ")").c_str());
  int value = 0;
  check_driver(api.device_attribute(&value, attribute, d),
               ("cuDeviceGetAttribute(" + std::string(name) + ") of device " + std::to_string(device)).c_str());
  return value;
}

}  // namespace moe_ep
