#include "nvlink/mirror_pool.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "common/cuda_check.hpp"

namespace moe_ep {

namespace {

// One slot per 64 bytes, so that two handles' mirrors never share a line.
constexpr size_t kSlotBytes = 64;
constexpr size_t kPageBytes = 4096;
static_assert(sizeof(kernels::HostTimeoutMirror) <= kSlotBytes, "a mirror fits its slot");

struct Pool {
  std::mutex mutex;
  std::vector<char*> free_slots;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: slots may be released during static destruction
  return *p;
}

// Portable: the page is mapped into every device's context, so one pool
// serves handles on any device.
void grow(Pool& p) {
  void* page = nullptr;
  check_cuda(cudaHostAlloc(&page, kPageBytes, cudaHostAllocMapped | cudaHostAllocPortable),
             "cudaHostAlloc(timeout mirror page)");
  char* bytes = static_cast<char*>(page);
  for (size_t off = kPageBytes; off >= kSlotBytes; off -= kSlotBytes) p.free_slots.push_back(bytes + off - kSlotBytes);
}

}  // namespace

MirrorSlot acquire_mirror_slot() {
  Pool& p = pool();
  char* slot = nullptr;
  {
    const std::lock_guard<std::mutex> lock(p.mutex);
    if (p.free_slots.empty()) grow(p);
    slot = p.free_slots.back();
    p.free_slots.pop_back();
  }
  MirrorSlot out;
  out.host = reinterpret_cast<kernels::HostTimeoutMirror*>(slot);
  out.host->timeout_phase = kernels::kPhaseNone;
  out.host->timeout_peer = -1;
  void* device = nullptr;
  const cudaError_t rc = cudaHostGetDevicePointer(&device, slot, 0);
  if (rc != cudaSuccess) {
    release_mirror_slot(out.host);
    check_cuda(rc, "cudaHostGetDevicePointer(timeout mirror)");
  }
  out.device = static_cast<kernels::HostTimeoutMirror*>(device);
  return out;
}

void release_mirror_slot(kernels::HostTimeoutMirror* host) noexcept {
  if (host == nullptr) return;
  Pool& p = pool();
  try {
    const std::lock_guard<std::mutex> lock(p.mutex);
    p.free_slots.push_back(reinterpret_cast<char*>(host));
  } catch (...) {
    // push_back can only fail for memory: the slot is then leaked, never reused twice
  }
}

}  // namespace moe_ep
