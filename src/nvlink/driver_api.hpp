// The few CUDA driver functions the backend needs (cuMem VMM), reached through
// cudaGetDriverEntryPointByVersion: libmoe_ep never links libcuda, so it loads
// on machines without a GPU driver.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>

#include <string>

namespace moe_ep {

struct DriverApi {
  PFN_cuMemCreate_v10020 mem_create = nullptr;
  PFN_cuMemRelease_v10020 mem_release = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 mem_export = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 mem_import = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemMap_v10020 mem_map = nullptr;
  PFN_cuMemUnmap_v10020 mem_unmap = nullptr;
  PFN_cuMemSetAccess_v10020 mem_set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 device_attribute = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  // Optional (NULL where the driver lacks them): the split phases' stream
  // wait and the watchdog's stream writes; without them a receive kernel waits itself.
  PFN_cuStreamWaitValue32_v11070 stream_wait_value32 = nullptr;
  PFN_cuStreamWriteValue32_v11070 stream_write_value32 = nullptr;
};

// The entry points, loaded once.  Throws UNSUPPORTED naming the missing
// function where the driver lacks one (or there is no driver).
const DriverApi& driver_api();

// Same, but never throws: NULL where unavailable.
const DriverApi* try_driver_api() noexcept;

// "cuMemCreate: CUDA_ERROR_NOT_PERMITTED (operation not permitted)".
std::string driver_error_text(const char* what, CUresult result);

// Throws a CUDA_ERROR (OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY) naming the call.
void check_driver(CUresult result, const char* what);

// The one way the backend reads a device attribute: the value, or a CUDA
// error naming the attribute and the device (never a silent 0).  `device` is
// the CUDA runtime ordinal.
int device_attribute(int device, CUdevice_attribute attribute, const char* name);

}  // namespace moe_ep
