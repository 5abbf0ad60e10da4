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

// Local checks and the size of this rank's allocation.
void SharedMemory::check_and_size(uint64_t bytes) {
  cu_device_ = cu_device_of(device_);
  if (!device_attribute(device_, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                        "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED")) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device_, " does not support CUDA virtual memory management");
  }
  size_ = allocation_size(device_, bytes);
  if (size_ > UINT64_MAX / static_cast<uint64_t>(world_)) {
    fail(MOE_EP_ERROR_OUT_OF_MEMORY, "workspace of ", size_, " bytes for ", world_, " ranks: too large");
  }
}

SharedMemory::SharedMemory(const Exchange& exchange, int device, uint64_t bytes, int timeout_ms)
    : device_(device), rank_(exchange.rank()), world_(exchange.world_size()), mapped_(world_, false) {
  run_then_agree(exchange, [&] { check_and_size(bytes); });  // a rank that cannot fails create on every rank
  try {
    if (!try_fabric(exchange)) share_posix_fds(exchange, timeout_ms);
  } catch (...) {
    release_all();
    throw;
  }
  log_info("rank ", rank_, ": workspace handle type ", handle_type_, ", ", size_, " bytes per rank mapped for ",
           world_, " ranks", fabric_note_.empty() ? "" : " (FABRIC not used: " + fabric_note_ + ")");
}

SharedMemory::SharedMemory(const Exchange& exchange, int device, uint64_t bytes, int timeout_ms,
                           const HandlePeers& peers)
    : device_(device), rank_(exchange.rank()), world_(exchange.world_size()), mapped_(world_, false) {
  try {
    exchange_at_rejoin(exchange, peers, timeout_ms, bytes);
  } catch (...) {
    release_all();
    throw;
  }
  log_info("rank ", rank_, ": rejoined; workspace handle type ", handle_type_, ", ", size_,
           " bytes per rank mapped for the active ranks");
}

void SharedMemory::admit(const Exchange& exchange, const HandlePeers& peers, int timeout_ms) {
  exchange_at_rejoin(exchange, peers, timeout_ms, 0);
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
bool SharedMemory::try_fabric(const Exchange& bootstrap) {
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
void SharedMemory::share_posix_fds(const Exchange& bootstrap, int timeout_ms) {
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
    create_posix_allocation();
    my_fd = UniqueFd(export_posix_fd());
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

void SharedMemory::create_posix_allocation() {
  if (!device_attribute(device_, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                        "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED")) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "device ", device_, " cannot export POSIX file descriptor handles");
  }
  const CUmemAllocationProp prop = allocation_prop(cu_device_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  check_driver(driver_api().mem_create(&local_handle_, size_, &prop, 0), "cuMemCreate(POSIX_FILE_DESCRIPTOR)");
  have_local_handle_ = true;
}

// A new descriptor of this rank's allocation (the caller owns it).
int SharedMemory::export_posix_fd() {
  int fd = -1;
  check_driver(driver_api().mem_export(&fd, local_handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
               "cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)");
  return fd;
}

namespace {

constexpr int32_t kNoHandle = 0, kFabricHandle = 1, kPosixHandle = 2;

// What each participant of a rejoin says first: the handle type and size of
// the group's allocations (a joining rank: none yet, and the size it would
// allocate), and its host, for POSIX descriptors.
struct RejoinOffer {
  int32_t handle_type;
  int32_t reserved;
  uint64_t size;
  HostIdentity host;
};

}  // namespace

// The memory side of a rejoin, the same steps on every participant (the
// store pairs them by order): a joining rank (new_bytes != 0, no allocation
// yet) checks its device and sizes its allocation, agreed; every offer is
// checked the same way on every participant (one handle type and one size
// for the whole group, one host for POSIX descriptors), so a mismatch fails
// every participant with the same message; then the joining ranks allocate
// with the group's type, and the handles go where HandlePeers::wants says.
void SharedMemory::exchange_at_rejoin(const Exchange& exchange, const HandlePeers& peers, int timeout_ms,
                                      uint64_t new_bytes) {
  const bool joining = new_bytes != 0;
  run_then_agree(exchange, [&] {
    if (joining) check_and_size(new_bytes);
  });
  RejoinOffer mine{};
  mine.handle_type = joining ? kNoHandle : std::strcmp(handle_type_, "FABRIC") == 0 ? kFabricHandle : kPosixHandle;
  mine.size = size_;
  mine.host = local_host_identity();
  const std::vector<RejoinOffer> offers = exchange.allgather_value(mine, "rejoin: memory offers");
  int32_t type = kNoHandle;
  run_then_agree(exchange, [&] {
    int first = -1;
    for (int r = 0; r < world_; ++r) {
      const RejoinOffer& o = offers[static_cast<size_t>(r)];
      if (!peers.participants[static_cast<size_t>(r)]) continue;
      if (o.size != size_) {
        fail(MOE_EP_ERROR_INVALID_ARGUMENT, "rejoin: rank ", r, "'s workspace is ", o.size, " bytes, rank ", rank_,
             "'s ", size_, " (the replacement must be made with the params and config of create)");
      }
      if (peers.joining[static_cast<size_t>(r)]) continue;
      if (o.handle_type != kFabricHandle && o.handle_type != kPosixHandle) {
        fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: rank ", r, " offers handle type ", o.handle_type,
             " (expected 1, FABRIC, or 2, POSIX_FILE_DESCRIPTOR)");
      }
      if (first < 0) {
        first = r;
        type = o.handle_type;
      } else if (o.handle_type != type) {
        fail(MOE_EP_ERROR_INVALID_INPUT, "rejoin: rank ", r, " offers handle type ", o.handle_type, ", rank ", first,
             " ", type, " (one group, one handle type)");
      }
    }
    if (first < 0) fail(MOE_EP_ERROR_INVALID_STATE, "rejoin: no active rank of the group takes part");
    for (int r = 0; r < world_ && type == kPosixHandle; ++r) {
      if (peers.participants[static_cast<size_t>(r)] && !same_host(offers[static_cast<size_t>(r)].host, mine.host)) {
        fail(MOE_EP_ERROR_UNSUPPORTED, "rejoin: the group shares POSIX file descriptors, which work within one ",
             "host; rank ", r, " is on ", describe_host(offers[static_cast<size_t>(r)].host), ", rank ", rank_, " on ",
             describe_host(mine.host));
      }
    }
  });

  // The handles: a joining rank's new allocation, the others' existing one.
  CUmemFabricHandle fabric{};
  UniqueFd my_fd;
  run_then_agree(exchange, [&] {
    if (type == kFabricHandle) {
      if (joining ? !export_fabric(&fabric)
                  : driver_api().mem_export(&fabric, local_handle_, CU_MEM_HANDLE_TYPE_FABRIC, 0) != CUDA_SUCCESS) {
        fail(MOE_EP_ERROR_UNSUPPORTED, "rejoin: the group shares FABRIC handles and rank ", rank_, " cannot export one",
             fabric_note_.empty() ? std::string() : ": " + fabric_note_);
      }
    } else {
      if (joining) create_posix_allocation();
      my_fd = UniqueFd(export_posix_fd());
    }
  });
  std::vector<CUmemFabricHandle> handles;
  std::vector<UniqueFd> fds;
  if (type == kFabricHandle) {
    handles = exchange.allgather_value(fabric, "rejoin: FABRIC handles");
  } else {
    fds = exchange_fds(exchange, my_fd.get(), timeout_ms, peers);
  }
  run_then_agree(exchange, [&] {
    const DriverApi& api = driver_api();
    if (joining) {
      reserve();
      map(rank_, local_handle_);
    }
    for (int r = 0; r < world_; ++r) {
      if (!peers.wants(rank_, r)) continue;
      CUmemGenericAllocationHandle imported = 0;
      if (type == kFabricHandle) {
        check_driver(api.mem_import(&imported, &handles[static_cast<size_t>(r)], CU_MEM_HANDLE_TYPE_FABRIC),
                     "cuMemImportFromShareableHandle(FABRIC)");
      } else {
        check_driver(api.mem_import(&imported, reinterpret_cast<void*>(static_cast<uintptr_t>(fds[r].get())),
                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                     "cuMemImportFromShareableHandle(POSIX_FILE_DESCRIPTOR)");
        fds[r].reset();
      }
      if (mapped_[r]) {  // what this rank held for it: the memory of the process it replaces
        api.mem_unmap(va_ + static_cast<uint64_t>(r) * size_, size_);
        mapped_[r] = false;
      }
      map_imported(r, imported);
    }
  });
  handle_type_ = type == kFabricHandle ? "FABRIC" : "POSIX_FILE_DESCRIPTOR";
}

// Reserves the group's range and maps every rank's allocation at its place:
// this rank's own, and each peer's as `import` returns it (released once
// mapped: the mapping keeps the memory alive).
void SharedMemory::map_group(const std::function<CUmemGenericAllocationHandle(int rank)>& import) {
  reserve();
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) {
      map(r, local_handle_);
      continue;
    }
    map_imported(r, import(r));
  }
}

// Maps a peer's imported allocation and releases the import handle, mapped
// or not (the mapping keeps the memory alive).
void SharedMemory::map_imported(int rank, CUmemGenericAllocationHandle imported) {
  try {
    map(rank, imported);
  } catch (...) {
    driver_api().mem_release(imported);
    throw;
  }
  driver_api().mem_release(imported);
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
