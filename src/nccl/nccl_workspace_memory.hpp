// The NCCL backend's one device allocation, in one of two kinds:
//   registered: ncclMemAlloc, then ncclCommRegister of the whole range, so
//     that NCCL's send/recv between two ranks' registered buffers over NVLink
//     copies straight from one to the other instead of through its staging
//     FIFO (NCCL's own send/recv of 56 MiB measured 230 -> 202 us on 2 H200);
//   plain: cudaMalloc, as NCCL's send/recv sees any caller's buffer.
// NCCL requires both sides of a send/recv to be registered or neither (it
// picks its chunking from it), so every rank must use the same kind and, once
// registered, every buffer the backend hands NCCL must lie inside this
// allocation (docs/nccl_backend.md, "Registered buffers").
#pragma once

#include <cstdint>
#include <memory>

#include "nccl/nccl_library.hpp"

namespace moe_ep {

// Whether this rank can and may register (same value on every rank is the
// caller's business): the handle's combine input is the zero-copy view (so
// combine sends from the workspace too), this NCCL has the registration
// calls, and MOE_EP_NCCL_REGISTER is not 0.
bool nccl_registration_wanted(const nccl::Api& api, bool zero_copy_combine);

class NcclWorkspaceMemory {
 public:
  // cudaMalloc'ed; throws CUDA_ERROR / OUT_OF_MEMORY.
  static std::unique_ptr<NcclWorkspaceMemory> plain(uint64_t bytes);
  // ncclMemAlloc'ed and registered on `comm`; NULL with *why when NCCL
  // refuses either (nothing is left allocated then).
  static std::unique_ptr<NcclWorkspaceMemory> registered(const nccl::Api& api, nccl::CommHandle comm, uint64_t bytes,
                                                         std::string* why);
  // Frees the memory.  A registration is released by destroying (or
  // aborting) the communicator, which must happen first.
  ~NcclWorkspaceMemory();
  NcclWorkspaceMemory(const NcclWorkspaceMemory&) = delete;
  NcclWorkspaceMemory& operator=(const NcclWorkspaceMemory&) = delete;

  char* base() const { return base_; }
  bool is_registered() const { return registration_ != nullptr; }
  // Deregisters now, for a create that falls back to plain memory because
  // another rank could not register (no transfer has used it yet, so no peer
  // is involved).
  void release_registration() noexcept;

 private:
  NcclWorkspaceMemory(char* base, const nccl::Api* api, nccl::CommHandle comm, void* registration)
      : base_(base), api_(api), comm_(comm), registration_(registration) {}
  char* base_;
  const nccl::Api* api_;   // set: ncclMemAlloc'ed (freed with ncclMemFree)
  nccl::CommHandle comm_;  // the communicator holding the registration
  void* registration_;     // ncclCommRegister's handle; NULL: not registered
};

}  // namespace moe_ep
