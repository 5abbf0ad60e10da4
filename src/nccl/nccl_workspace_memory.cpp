#include "nccl/nccl_workspace_memory.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "common/cuda_check.hpp"
#include "common/tuning_registry.hpp"

namespace moe_ep {

bool nccl_registration_wanted(const nccl::Api& api, bool zero_copy_combine) {
  return zero_copy_combine && api.can_register() && knob_bool(Knob::kNcclRegister);
}

std::unique_ptr<NcclWorkspaceMemory> NcclWorkspaceMemory::plain(uint64_t bytes) {
  void* p = nullptr;
  check_cuda(cudaMalloc(&p, bytes), "cudaMalloc(NCCL backend workspace)");
  return std::unique_ptr<NcclWorkspaceMemory>(
      new NcclWorkspaceMemory(static_cast<char*>(p), nullptr, nullptr, nullptr));
}

std::unique_ptr<NcclWorkspaceMemory> NcclWorkspaceMemory::registered(const nccl::Api& api, nccl::CommHandle comm,
                                                                     uint64_t bytes, std::string* why) {
  void* p = nullptr;
  nccl::Result r = api.MemAlloc(&p, bytes);
  if (r != nccl::kSuccess || p == nullptr) {
    *why = api.describe("ncclMemAlloc", r, comm);
    return nullptr;
  }
  void* handle = nullptr;
  r = api.CommRegister(comm, p, bytes, &handle);
  if (r != nccl::kSuccess) {
    *why = api.describe("ncclCommRegister", r, comm);
    api.MemFree(p);
    return nullptr;
  }
  // Destroying the communicator releases every registration it holds, so the
  // handle is only used by release_registration (a deregistration at destroy
  // time could wait on a peer that has already gone).
  return std::unique_ptr<NcclWorkspaceMemory>(new NcclWorkspaceMemory(static_cast<char*>(p), &api, comm, handle));
}

void NcclWorkspaceMemory::release_registration() noexcept {
  if (registration_ != nullptr) api_->CommDeregister(comm_, registration_);
  registration_ = nullptr;
}

NcclWorkspaceMemory::~NcclWorkspaceMemory() {
  if (api_ != nullptr) {
    api_->MemFree(base_);
  } else {
    cudaFree(base_);
  }
  cudaGetLastError();  // a teardown must not leave an error behind for the caller
}

}  // namespace moe_ep
