// One cuMem VMM allocation per rank, mapped into every rank of the group
// (docs/semantics.md §5).  Handles are FABRIC when every rank can create and export one,
// else POSIX file descriptors passed over AF_UNIX sockets (one host only).
// Every rank's allocation is mapped at its place in one virtual range
// [base, base + world*size): at construction, and for a replacement process
// that rejoins the group (failure_policy MASK), again when the survivors
// admit it.  Everything is unmapped and released by the destructor, which
// never waits for a peer.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bootstrap.hpp"
#include "nvlink/fd_exchange.hpp"

namespace moe_ep {

class SharedMemory {
 public:
  // Collective.  `bytes` is rounded up to allocation_size(device, bytes).
  SharedMemory(const Exchange& exchange, int device, uint64_t bytes, int timeout_ms);
  // A replacement process's memory: collective among peers.participants, the
  // others of which call admit() with the same peers.  It takes the group's
  // handle type and maps every participant's allocation; the ranks that take
  // no part stay unmapped here (nothing may touch them).
  SharedMemory(const Exchange& exchange, int device, uint64_t bytes, int timeout_ms, const HandlePeers& peers);
  ~SharedMemory();
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Bytes cuMemCreate allocates for a request of `bytes` on `device`.
  static uint64_t allocation_size(int device, uint64_t bytes);

  // Collective among peers.participants, the joining ones of which construct
  // theirs: maps each joining rank's new allocation at its place, in place of
  // what this rank held there (a dead process's memory, released then).
  void admit(const Exchange& exchange, const HandlePeers& peers, int timeout_ms);

  uint64_t size() const { return size_; }
  // Whether rank's allocation is mapped here (a rank that never joined a
  // replacement's group, or one whose admission failed midway, is not).
  bool mapped(int rank) const { return mapped_[static_cast<size_t>(rank)]; }
  char* local() const { return rank_base(rank_); }
  char* rank_base(int rank) const {
    return reinterpret_cast<char*>(static_cast<uintptr_t>(va_ + static_cast<uint64_t>(rank) * size_));
  }
  const char* handle_type() const { return handle_type_; }
  const std::string& fabric_note() const { return fabric_note_; }

 private:
  void check_and_size(uint64_t bytes);
  bool export_fabric(CUmemFabricHandle* handle);
  bool try_fabric(const Exchange& exchange);
  void share_posix_fds(const Exchange& exchange, int timeout_ms);
  void create_posix_allocation();
  int export_posix_fd();
  void exchange_at_rejoin(const Exchange& exchange, const HandlePeers& peers, int timeout_ms, uint64_t new_bytes);
  void map_group(const std::function<CUmemGenericAllocationHandle(int rank)>& import);
  void reserve();
  void map(int rank, CUmemGenericAllocationHandle handle);
  void map_imported(int rank, CUmemGenericAllocationHandle imported);
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
