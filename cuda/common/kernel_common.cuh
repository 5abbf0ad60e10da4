// Small helpers shared by the dispatch and combine kernels: where a rank's
// regions are, and the set of ranks a token goes to.
#pragma once

#include <stdint.h>

#include "common/device_sync.cuh"
#include "common/split_ready.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

constexpr int kWarpsPerBlock = kBlockThreads / 32;
// A warp moves a row in steps of 32 lanes x kVectorsPerLane 16-byte vectors.
constexpr int kVectorsPerLane = 8;
constexpr int kSegmentBytes = 32 * kVectorsPerLane * 16;

struct KernelContext {
  GroupShape shape;
  WorkspaceOffsets offsets;
  HandleState state;

  __device__ __forceinline__ ControlBlock* control() const {
    return reinterpret_cast<ControlBlock*>(state.local_base + offsets.control);
  }
  // Base of rank r's workspace as mapped in this process (r == rank: local).
  __device__ __forceinline__ char* rank_base(int r) const {
    return reinterpret_cast<char*>(reinterpret_cast<const uint64_t*>(state.local_base + offsets.peer_bases)[r]);
  }
  template <typename T>
  __device__ __forceinline__ T* local(uint64_t offset) const {
    return reinterpret_cast<T*>(state.local_base + offset);
  }
  template <typename T>
  __device__ __forceinline__ T* remote(int r, uint64_t offset) const {
    return reinterpret_cast<T*>(rank_base(r) + offset);
  }
  // Segment of rank `source`'s rows inside rank `dest`'s combine_in region
  // (dest keeps no segment for itself).
  __device__ __forceinline__ int combine_segment(int source, int dest) const {
    return source < dest ? source : source - 1;
  }
};

// The ranks one token goes to, read by a warp from its token_slots row:
// lane i holds the slot on rank i (and on rank 32 + i), -1 where not sent.
struct TokenDestinations {
  uint64_t mask;
  int32_t slot_low;
  int32_t slot_high;

  __device__ __forceinline__ static TokenDestinations load(const int32_t* slots_row, int world, int lane) {
    TokenDestinations d;
    d.slot_low = lane < world ? slots_row[lane] : -1;
    d.slot_high = lane + 32 < world ? slots_row[lane + 32] : -1;
    d.mask = static_cast<uint64_t>(__ballot_sync(0xFFFFFFFFu, d.slot_low >= 0)) |
             (static_cast<uint64_t>(__ballot_sync(0xFFFFFFFFu, d.slot_high >= 0)) << 32);
    return d;
  }
  // Warp-collective: every lane must call it with the same rank.
  __device__ __forceinline__ int32_t slot(int rank) const {
    const int32_t low = __shfl_sync(0xFFFFFFFFu, slot_low, rank & 31);
    const int32_t high = __shfl_sync(0xFFFFFFFFu, slot_high, rank & 31);
    return rank < 32 ? low : high;
  }
};

// After a barrier, one thread makes every store of the block visible and
// counts the block in at every rank: counters[this rank] in each rank's
// region at `counters_offset` (see arrival_weight).  A send half
// (kSendHalf) also adds the weight to every peer's ready word at
// `ready_offset` (common/split_ready.cuh); a template argument, so that the
// fused kernels compile as if the split did not exist.
// Nothing goes to an absent rank (`absent`: ControlBlock::absent_ranks, as
// thread 0 read it at kernel start): a rank the survivors dropped while it
// was alive then finds that nobody answers, times out and learns it was
// dropped.
template <bool kSendHalf = false>
__device__ inline void publish_block_arrival(const KernelContext& c, uint64_t absent, uint64_t counters_offset,
                                             uint64_t ready_offset = 0) {
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_sys();  // one fence, then relaxed adds: peers first, this rank last
    const uint64_t weight = arrival_weight();
    const int world = c.shape.world_size;
    for (int i = 1; i <= world; ++i) {
      const int d = (c.shape.rank + i) % world;
      if (((absent >> d) & 1u) == 0) red_relaxed_sys_add(c.remote<uint64_t>(d, counters_offset) + c.shape.rank, weight);
    }
    if (kSendHalf) add_ready_at_peers(c, ready_offset, static_cast<uint32_t>(weight), absent);
  }
}

__device__ __forceinline__ int lowest_rank(uint64_t mask) { return __ffsll(static_cast<long long>(mask)) - 1; }

}  // namespace kernels
}  // namespace moe_ep
