// One cuMem VMM allocation per rank, mapped into every rank of the group
// (docs/semantics.md §5).  Handles are FABRIC when every rank can create and export one,
// else POSIX file descriptors passed over AF_UNIX sockets (one host only).
// Every rank's allocation is mapped once, at construction, into one virtual
// range [base, base + world*size); everything is unmapped and released by the
// destructor, which never waits for a peer.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap.hpp"

namespace moe_ep {

class SharedMemory {
 public:
  // Collective.  `bytes` is rounded up to allocation_size(device, bytes).
  SharedMemory(const Bootstrap& bootstrap, int device, uint64_t bytes, int timeout_ms);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Bytes cuMemCreate allocates for a request of `bytes` on `device`.
  static uint64_t allocation_size(int device, uint64_t bytes);

  uint64_t size() const { return size_; }
  char* local() const { return rank_base(rank_); }
  char* rank_base(int rank) const {
    return reinterpret_cast<char*>(static_cast<uintptr_t>(va_ + static_cast<uint64_t>(rank) * size_));
  }
  const char* handle_type() const { return handle_type_; }
  const std::string& fabric_note() const { return fabric_note_; }

 private:
  bool export_fabric(CUmemFabricHandle* handle);
  bool try_fabric(const Bootstrap& bootstrap);
  void share_posix_fds(const Bootstrap& bootstrap, int timeout_ms);
  void map_group(const std::function<CUmemGenericAllocationHandle(int rank)>& import);
  void reserve();
  void map(int rank, CUmemGenericAllocationHandle handle);
  void release_all() noexcept;

  int device_ = 0;
  int rank_ = 0;
  int world_ = 1;
  CUdevice cu_device_ = 0;
  uint64_t size_ = 0;
  CUdeviceptr va_ = 0;
  CUmemGenericAllocationHandle local_handle_ = 0;
  bool have_local_handle_ = false;
  std::vector<bool> mapped_;
  const char* handle_type_ = "none";
  std::string fabric_note_;  // why FABRIC was not used
};

}  // namespace moe_ep
