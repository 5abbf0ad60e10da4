#include "common/gpu_context.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

namespace moe_ep {

namespace {

struct ContextCalls {
  PFN_cuCtxGetCurrent_v4000 get = nullptr;
  PFN_cuCtxSetCurrent_v4000 set = nullptr;
};

// Loaded once through the runtime's entry-point query (libmoe_ep never links
// libcuda); both NULL where there is no driver.
const ContextCalls& context_calls() {
  static const ContextCalls calls = [] {
    ContextCalls c;
    void* get = nullptr;
    void* set = nullptr;
    cudaDriverEntryPointQueryResult found_get = cudaDriverEntryPointSymbolNotFound;
    cudaDriverEntryPointQueryResult found_set = cudaDriverEntryPointSymbolNotFound;
    const bool ok =
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get, 4000, cudaEnableDefault, &found_get) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuCtxSetCurrent", &set, 4000, cudaEnableDefault, &found_set) == cudaSuccess &&
        found_get == cudaDriverEntryPointSuccess && found_set == cudaDriverEntryPointSuccess;
    cudaGetLastError();  // leave no sticky runtime error behind
    if (ok) {
      c.get = reinterpret_cast<PFN_cuCtxGetCurrent_v4000>(get);
      c.set = reinterpret_cast<PFN_cuCtxSetCurrent_v4000>(set);
    }
    return c;
  }();
  return calls;
}

}  // namespace

void* current_gpu_context() noexcept {
  try {
    const ContextCalls& c = context_calls();
    CUcontext ctx = nullptr;
    if (c.get == nullptr || c.get(&ctx) != CUDA_SUCCESS) return nullptr;
    return ctx;
  } catch (...) {
    return nullptr;
  }
}

void make_gpu_context_current(void* context) noexcept {
  if (context == nullptr) return;
  try {
    const ContextCalls& c = context_calls();
    if (c.set != nullptr) c.set(static_cast<CUcontext>(context));
  } catch (...) {
  }
}

}  // namespace moe_ep
