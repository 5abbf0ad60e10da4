// What every dispatch step shares: the kernels' parameters, the routing
// state in shared memory, and the owner of an expert.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/fast_division.h"
#include "common/kernel_common.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

// Experts up to this count are counted in shared memory, larger in global.
constexpr int kSharedHistogram = 4096;
// Routing rounds (of kBlockThreads tokens) whose ids are loaded before use.
constexpr int kRoundsPerPass = 4;

struct DispatchParams {
  KernelContext ctx;
  DispatchLaunch args;
};

struct RoutingShared {
  uint32_t warp_counts[kWarpsPerBlock][kMaxWorldSize];
  uint32_t warp_offsets[kWarpsPerBlock][kMaxWorldSize];
  uint32_t totals[kMaxWorldSize];       // tokens bound to each rank so far (general kernel: own tokens only)
  int32_t histogram[kSharedHistogram];  // valid picks per expert counted by this block (histogram_of)
  uint32_t timed_out;                   // the handle's timeout record at kernel start
  uint64_t absent;                      // ControlBlock::absent_ranks, read by thread 0 at kernel start
  // General kernel only (the look-back):
  uint32_t before[kMaxWorldSize];    // tokens of blocks 0 .. L - 1 bound to each rank
  uint32_t all_rows[kMaxWorldSize];  // last block: the rows this rank sends each rank
  uint64_t epoch;                    // this call's number
  uint32_t tag;                      // this call's look-back tag
  int32_t logical;                   // L
};

__device__ __forceinline__ bool is_valid_expert(const GroupShape& s, int32_t id) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(s.num_experts);
}

__device__ __forceinline__ int owner_of(const GroupShape& s, int32_t id) {
  return static_cast<int>(divide_by_magic(static_cast<uint32_t>(id), s.owner_magic, s.owner_shift));
}

// The ranks whose experts this call routes to (ControlBlock::masked_ranks,
// inverted): every bit while every rank is active.  Read once per thread; the
// host changes it only between calls.
__device__ __forceinline__ uint64_t routable_ranks(const DispatchParams& p) {
  return ~__ldg(reinterpret_cast<const unsigned long long*>(&p.ctx.control()->masked_ranks));
}

__device__ __forceinline__ int32_t* histogram_of(const DispatchParams& p, RoutingShared& sh) {
  return p.ctx.shape.num_experts <= kSharedHistogram ? sh.histogram : p.ctx.local<int32_t>(p.ctx.offsets.expert_hist);
}

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
