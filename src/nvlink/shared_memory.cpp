#include "nvlink/shared_memory.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "collective_step.hpp"
#include "common/cuda_check.hpp"
#include "common/host_identity.hpp"
#include "common/log.hpp"
#include "common/region_planner.hpp"
#include "common/tuning_registry.hpp"
#include "error.hpp"
#include "nvlink/driver_api.hpp"
#include "nvlink/fd_exchange.hpp"

namespace moe_ep {

namespace {

CUmemAllocationProp allocation_prop(CUdevice device, CUmemAllocationHandleType type) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = type;
  return prop;
}

CUdevice cu_device_of(int ordinal) {
  CUdevice d = 0;
  check_driver(driver_api().device_get(&d, ordinal), "cuDeviceGet");
  return d;
}

uint64_t granularity(CUdevice device, CUmemAllocationHandleType type) {
  const CUmemAllocationProp prop = allocation_prop(device, type);
  size_t g = 0;
  check_driver(driver_api().granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  return g;
}

// The granularity every handle type the device may use agrees with.
uint64_t common_granularity(int device) {
  const CUdevice cu = cu_device_of(device);
  uint64_t g = granularity(cu, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (device_attribute(device, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, "HANDLE_TYPE_FABRIC_SUPPORTED")) {
    // Where FABRIC cannot be used the query may fail too: then only POSIX counts.
    const CUmemAllocationProp prop = allocation_prop(cu, CU_MEM_HANDLE_TYPE_FABRIC);
    size_t f = 0;
    if (driver_api().granularity(&f, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && f > g) g = f;
  }
  return g;
}

}  // namespace

uint64_t SharedMemory::allocation_size(int device, uint64_t bytes) {
  const uint64_t g = common_granularity(device);
  if (bytes > UINT64_MAX - g) fail(MOE_EP_ERROR_OUT_OF_MEMORY, "workspace of ", bytes, " bytes: too large");
  return align_up(bytes == 0 ? 1 : bytes, g, "workspace", MOE_EP_ERROR_OUT_OF_MEMORY);
}

SharedMemory::SharedMemory(const Bootstrap& bootstrap, int device, uint64_t bytes, int timeout_ms)
    : device_(device), rank_(bootstrap.rank()), world_(bootstrap.world_size()), mapped_(world_, false) {
  run_then_agree(bootstrap, [&] {
    cu_device_ = cu_device_of(device);
    if (!device_attribute(device, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                          "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED")) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device, " does not support CUDA virtual memory management");
    }
    size_ = allocation_size(device, bytes);
    if (size_ > UINT64_MAX / static_cast<uint64_t>(world_)) {
      fail(MOE_EP_ERROR_OUT_OF_MEMORY, "workspace of ", size_, " bytes for ", world_, " ranks: too large");
    }
  });

  try {
    if (!try_fabric(bootstrap)) share_posix_fds(bootstrap, timeout_ms);
  } catch (...) {
    release_all();
    throw;
  }
  log_info("rank ", rank_, ": workspace handle type ", handle_type_, ", ", size_, " bytes per rank mapped for ",
           world_, " ranks", fabric_note_.empty() ? "" : " (FABRIC not used: " + fabric_note_ + ")");
}

SharedMemory::~SharedMemory() { release_all(); }

// Creates this rank's allocation with a FABRIC handle and exports it.
// Returns false, with fabric_note_ saying why, where this rank cannot.
bool SharedMemory::export_fabric(CUmemFabricHandle* handle) {
  const DriverApi& api = driver_api();
  // MOE_EP_FABRIC=0 skips the attempt, where it is known to be refused (no IMEX
  // channel): the refusal is harmless, but tools such as compute-sanitizer
  // report the failed cuMemCreate.  One rank saying no is enough (try_fabric).
  if (!knob_bool(Knob::kFabric)) {
    fabric_note_ = "MOE_EP_FABRIC=0";
    return false;
  }
  if (!device_attribute(device_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED, "HANDLE_TYPE_FABRIC_SUPPORTED")) {
    fabric_note_ = "device attribute HANDLE_TYPE_FABRIC_SUPPORTED is 0";
    return false;
  }
  const CUmemAllocationProp prop = allocation_prop(cu_device_, CU_MEM_HANDLE_TYPE_FABRIC);
  CUresult rc = api.mem_create(&local_handle_, size_, &prop, 0);
  if (rc != CUDA_SUCCESS) {
    fabric_note_ = driver_error_text("cuMemCreate(FABRIC)", rc);
    return false;
  }
  have_local_handle_ = true;
  rc = api.mem_export(handle, local_handle_, CU_MEM_HANDLE_TYPE_FABRIC, 0);
  if (rc != CUDA_SUCCESS) {
    fabric_note_ = driver_error_text("cuMemExportToShareableHandle(FABRIC)", rc);
    return false;
  }
  return true;
}

// FABRIC handles, if every rank can create and export one.  Returns false
// (with nothing left allocated) when the group must use another handle type.
bool SharedMemory::try_fabric(const Bootstrap& bootstrap) {
  CUmemFabricHandle mine{};
  int32_t ok = 0;
  try {
    ok = export_fabric(&mine) ? 1 : 0;
  } catch (...) {
    status_of_current_exception(&fabric_note_);  // this rank cannot; the group learns it below
  }
  const std::vector<int32_t> all_ok = bootstrap.allgather_value(ok);
  bool everyone = true;
  for (int r = 0; r < world_; ++r) {
    if (!all_ok[r] && fabric_note_.empty()) fabric_note_ = "rank " + std::to_string(r) + " cannot export FABRIC handles";
    everyone = everyone && all_ok[r] != 0;
  }
  if (!everyone) {
    release_all();
    return false;
  }

  const std::vector<CUmemFabricHandle> handles = bootstrap.allgather_value(mine);
  try {
    run_then_agree(bootstrap, [&] {
      map_group([&](int r) {
        CUmemGenericAllocationHandle imported = 0;
        check_driver(driver_api().mem_import(&imported, const_cast<CUmemFabricHandle*>(&handles[r]),
                                             CU_MEM_HANDLE_TYPE_FABRIC),
                     "cuMemImportFromShareableHandle(FABRIC)");
        return imported;
      });
    });
  } catch (const Error& e) {
    if (e.status() == MOE_EP_ERROR_BOOTSTRAP) throw;
    fabric_note_ = e.what();  // every rank saw the same failure: fall back together
    release_all();
    mapped_.assign(world_, false);
    return false;
  }
  handle_type_ = "FABRIC";
  return true;
}

// POSIX file descriptors over AF_UNIX sockets: all ranks on one host.
void SharedMemory::share_posix_fds(const Bootstrap& bootstrap, int timeout_ms) {
  const std::vector<HostIdentity> hosts = bootstrap.allgather_value(local_host_identity());
  for (int r = 1; r < world_; ++r) {
    if (!same_host(hosts[r], hosts[0])) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "NVLINK_TWO_SIDED: FABRIC handles are unavailable (", fabric_note_,
           ") and the ranks are on different hosts (rank 0 on ", describe_host(hosts[0]), ", rank ", r, " on ",
           describe_host(hosts[r]), "); POSIX file descriptors only work within one host");
    }
  }

  UniqueFd my_fd;
  run_then_agree(bootstrap, [&] {
    if (!device_attribute(device_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                          "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device_, " cannot export POSIX file descriptor handles");
    }
    const DriverApi& api = driver_api();
    const CUmemAllocationProp prop = allocation_prop(cu_device_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    check_driver(api.mem_create(&local_handle_, size_, &prop, 0), "cuMemCreate(POSIX_FILE_DESCRIPTOR)");
    have_local_handle_ = true;
    int fd = -1;
    check_driver(api.mem_export(&fd, local_handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)");
    my_fd = UniqueFd(fd);
  });

  // Only descriptors from authenticated group members come back (fd_exchange.hpp).
  std::vector<UniqueFd> fds = exchange_fds(bootstrap, my_fd.get(), timeout_ms);
  run_then_agree(bootstrap, [&] {
    map_group([&](int r) {
      CUmemGenericAllocationHandle imported = 0;
      check_driver(driver_api().mem_import(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[r].get())),
                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)");
      fds[r].reset();
      return imported;
    });
  });
  handle_type_ = "POSIX_FILE_DESCRIPTOR";
}

// Reserves the group's range and maps every rank's allocation at its place:
// this rank's own, and each peer's as `import` returns it (released once
// mapped: the mapping keeps the memory alive).
void SharedMemory::map_group(const std::function<CUmemGenericAllocationHandle(int rank)>& import) {
  const DriverApi& api = driver_api();
  reserve();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) {
      map(r, local_handle_);
      continue;
    }
    const CUmemGenericAllocationHandle imported = import(r);
    try {
      map(r, imported);
    } catch (...) {
      api.mem_release(imported);
      throw;
    }
    api.mem_release(imported);
  }
}

void SharedMemory::reserve() {
  // Alignment 0: the allocation granularity, which size_ is a multiple of.
  check_driver(driver_api().address_reserve(&va_, size_ * world_, 0, 0, 0), "cuMemAddressReserve");
}

// Maps one rank's allocation at its place and opens it to this device.
void SharedMemory::map(int rank, CUmemGenericAllocationHandle handle) {
  const DriverApi& api = driver_api();
  const CUdeviceptr at = va_ + static_cast<uint64_t>(rank) * size_;
  check_driver(api.mem_map(at, size_, 0, handle, 0), "cuMemMap");
  mapped_[rank] = true;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = cu_device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult rc = api.mem_set_access(at, size_, &access, 1);
  if (rc != CUDA_SUCCESS) {
    fail(MOE_EP_ERROR_UNSUPPORTED,
         driver_error_text(("cuMemSetAccess (device " + std::to_string(device_) + " reading rank " +
                            std::to_string(rank) + "'s memory; is there a peer-to-peer path?)")
                               .c_str(),
                           rc));
  }
}

void SharedMemory::release_all() noexcept {
  const DriverApi* api = try_driver_api();
  if (api == nullptr) return;
  for (int r = 0; r < world_; ++r) {
    if (mapped_[r]) api->mem_unmap(va_ + static_cast<uint64_t>(r) * size_, size_);
    mapped_[r] = false;
  }
  if (va_ != 0) api->address_free(va_, size_ * world_);
  va_ = 0;
  if (have_local_handle_) api->mem_release(local_handle_);
  have_local_handle_ = false;
}

}  // namespace moe_ep
