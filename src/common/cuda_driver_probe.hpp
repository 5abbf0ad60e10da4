// Whether a CUDA driver is installed at all.  The CUDA runtime answers
// cudaErrorInsufficientDriver ("CUDA driver version is insufficient for CUDA
// runtime version") both where the driver is older than the runtime and where
// there is no driver; users need to hear which.  The driver is libcuda.so.1:
// if it does not load, there is none.  Needs no CUDA header, so that a build
// without the GPU backends can say it too.
#pragma once

#include <dlfcn.h>

#include <string>

namespace moe_ep {

// "" when libcuda.so.1 loads; otherwise "no CUDA driver found (<why it did not load>)".
inline std::string cuda_driver_missing() {
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
    return "";
  }
  const char* why = dlerror();
  return std::string("no CUDA driver found (") + (why != nullptr ? why : "libcuda.so.1 did not load") +
         "): install the NVIDIA driver, or use MOE_EP_BACKEND_HOST";
}

// "CUDA X.Y" from a version number of the CUDA API (12080 = 12.8).
inline std::string cuda_version_text(int version) {
  return "CUDA " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// What cudaErrorInsufficientDriver means here: no driver, or a driver older
// than the runtime (driver_version and runtime_version as the CUDA runtime
// reports them; 0 = unknown).
inline std::string describe_insufficient_driver(int driver_version, int runtime_version) {
  const std::string missing = cuda_driver_missing();
  if (!missing.empty()) return missing;
  std::string s = "the CUDA driver is older than the CUDA runtime moe_ep was built with";
  if (driver_version > 0 && runtime_version > 0) {
    s += " (the driver supports up to " + cuda_version_text(driver_version) + ", the runtime is " +
         cuda_version_text(runtime_version) + ")";
  }
  return s + ": update the NVIDIA driver";
}

}  // namespace moe_ep
