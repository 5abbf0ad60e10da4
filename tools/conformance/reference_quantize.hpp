// bench --wire quantize+as_is: what a caller runs today to move FP8 rows, a
// separate quantize kernel before an AS_IS dispatch of the e4m3 rows and their
// scales, as a plain reference to compare the in-kernel FP8 dispatch wire
// with.  The kernel takes bf16 rows [T, R] and writes e4m3fn codes [T, R] and
// one fp32 scale per 128-element block [T, ceil(R / 128)], following the
// rounding rules of docs/semantics.md ("A low-precision wire": amax over the
// finite elements, FP32 or UE8M0 scales, one fp32 division per value, round
// to nearest even with saturation, NaN to 0x7F); the bench checks its output
// against the oracle once per size.  One warp per block of 128 elements: each
// lane loads 4 consecutive elements (8-byte loads where R is a multiple of 4),
// the warp reduces amax with shuffles, and each lane writes its 4 codes (one
// 4-byte store), lane 0 the scale: one coalesced pass over the rows, the
// values kept in registers between the reduction and the division.
// Straightforward on purpose, not tuned.  GPU only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "memory.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

// "" when the reference kernel can quantize the rows of `source` here, else
// why not.  source: the bf16 rows before quantization (the FP8 dispatch wire's
// workload: hidden_dtype bf16, no scales, dispatch_wire FP8, wire_scale).
std::string reference_quantize_refusal(bool on_gpu, const moe_ep_verify::WorkloadSpec& source);

class ReferenceQuantize {
 public:
  // largest: the largest source workload of the sweep (the buffer holds its rows).
  ReferenceQuantize(const Place& place, const moe_ep_verify::WorkloadSpec& largest);

  // This rank's bf16 rows of `source` (what the FP8 wire would quantize).
  void load(const moe_ep_verify::WorkloadSpec& source, int rank, void* stream);
  // The loaded rows into codes [T, R] e4m3fn and scales [T, ceil(R / 128)] fp32 (device memory).
  cudaError_t quantize(void* codes, void* scales, cudaStream_t stream) const;
  // After quantize (read back, not in a capture): codes and scales that
  // differ from the oracle's quantization of the same rows.
  int64_t check(const void* codes, const void* scales, cudaStream_t stream) const;

 private:
  Place place_;
  Buffer rows_;
  moe_ep_verify::WorkloadSpec source_;
  int rank_ = 0, num_tokens_ = 0;
};

}  // namespace moe_ep_tool
