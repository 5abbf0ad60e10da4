// The whole-row pull's timing diagnostics, compiled only in measurement
// builds (the CMake option MOE_EP_DIAGNOSTICS); in any other build
// pull_diagnostic() is 0 and every test of it compiles away.
//
// Part of the pull kernel's one translation unit (combine/pull.cu): device
// code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "combine/common.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Measurement builds only (MOE_EP_DIAGNOSTICS): parts of
// the whole-row pull switched off to time the rest; results are then wrong.
enum PullDiagnostic : int32_t { kDiagNoAdds = 1, kDiagNoStores = 2, kDiagNoCopies = 4 };
__device__ __forceinline__ int32_t pull_diagnostic(const CombineParams& p) {
#ifdef MOE_EP_DIAGNOSTICS
  return p.args.pull_diagnostic;
#else
  (void)p;
  return 0;
#endif
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
