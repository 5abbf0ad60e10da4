// The pull's loads of 2 KiB segments (rows that the whole-row path does not
// take): element by element, into registers, or bulk copies per warp.
//
// Part of the pull kernel's one translation unit (combine/pull.cu): device
// code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "combine/common.cuh"
#include "combine/reduce.cuh"
#include "common/bulk_copy.cuh"
#include "common/device_sync.cuh"
#include "common/kernel_common.cuh"

namespace moe_ep {
namespace kernels {
namespace {

constexpr int kPullStages = 6;
constexpr size_t kPullBufferBytes = size_t{kWarpsPerBlock} * kPullStages * kReduceSegmentBytes;
constexpr size_t kPullBarrierBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(uint64_t);
constexpr size_t kPullItemBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(int64_t);
constexpr size_t kPullRankBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(int32_t);
constexpr size_t kPullSegmentSharedBytes = kPullBufferBytes + kPullBarrierBytes + kPullItemBytes + kPullRankBytes;

// Rows of any size or alignment (and devices without bulk copies): a token per
// warp, element by element, from the same places.
template <typename Element>
__device__ void pull_reduce_rows(const CombineParams& p) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; token < p.args.num_tokens;
       token += step) {
    const TokenDestinations srcs = TokenDestinations::load(slots + token * s.world_size, s.world_size, lane);
    reduce_row_any<Element>(p, static_cast<int32_t>(token), srcs, lane);
  }
}

// Aligned rows, partials loaded into registers (where there are no bulk copies):
// what every warp keeps in flight is 4 KiB (two ranks' 2 KiB segments).
template <typename Element>
__device__ void pull_reduce_registers(const CombineParams& p) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int segments = reduce_segments(p, true);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += step) {
    const int64_t token = item / segments;
    const TokenDestinations srcs = TokenDestinations::load(slots + token * s.world_size, s.world_size, lane);
    reduce_segment<Element>(p, static_cast<int32_t>(token), static_cast<int>(item % segments), srcs, lane);
  }
}

#ifdef MOE_EP_HAVE_BULK_COPY
// One warp's buffers and what each holds: the copy of one rank's partial of
// one (token, segment) item.
struct WarpStages {
  char* buffers;       // [kPullStages][kReduceSegmentBytes]
  uint64_t* barriers;  // [kPullStages]
  int64_t* items;      // [kPullStages]: the item whose partial the buffer holds
  int32_t* ranks;      // [kPullStages]: the rank that computed it (for a timeout record)

  __device__ WarpStages(char* shared, int warp) {
    const int first = warp * kPullStages;
    buffers = shared + static_cast<size_t>(first) * kReduceSegmentBytes;
    barriers = reinterpret_cast<uint64_t*>(shared + kPullBufferBytes) + first;
    items = reinterpret_cast<int64_t*>(shared + kPullBufferBytes + kPullBarrierBytes) + first;
    ranks = reinterpret_cast<int32_t*>(shared + kPullBufferBytes + kPullBarrierBytes + kPullItemBytes) + first;
  }
};

// The producer side of a warp: walks the same (item, rank) sequence as the
// consumer, issuing one bulk copy per step into the next free buffer.
class PartialProducer {
 public:
  __device__ PartialProducer(const CombineParams& p, const WarpStages& stages, int64_t first, int64_t step,
                             int64_t items, int segments)
      : p_(p), stages_(stages), item_(first - step), step_(step), items_(items), segments_(segments) {}

  // Warp-collective.  Issues the copy of the next partial into buffer
  // `issued % kPullStages`; false when every partial has been issued.
  __device__ bool issue(uint32_t issued) {
    const int lane = threadIdx.x % 32;
    const int world = p_.ctx.shape.world_size;
    while (rest_ == 0) {
      if (item_ + step_ >= items_) return false;
      item_ += step_;
      const int32_t* slots = p_.ctx.local<int32_t>(p_.ctx.offsets.token_slots);
      srcs_ = TokenDestinations::load(slots + (item_ / segments_) * world, world, lane);
      rest_ = srcs_.mask;
    }
    const int q = lowest_rank(rest_);
    rest_ &= rest_ - 1;
    const int32_t slot = srcs_.slot(q);  // every lane
    const int segment = static_cast<int>(item_ % segments_);
    const int stage = static_cast<int>(issued % kPullStages);
    if (lane == 0) {
      stages_.items[stage] = item_;
      stages_.ranks[stage] = q;
      fence_shared_before_bulk_copy();  // the buffer's last reads
      bulk_copy_to_shared(stages_.buffers + static_cast<size_t>(stage) * kReduceSegmentBytes,
                          partial_row(p_, q, slot) + static_cast<int64_t>(segment) * kReduceSegmentBytes,
                          static_cast<uint32_t>(reduce_segment_vectors(p_, segment)) * 16u, stages_.barriers + stage);
    }
    __syncwarp();  // the buffer's item and rank, for every lane
    return true;
  }

 private:
  const CombineParams& p_;
  const WarpStages& stages_;
  int64_t item_;
  const int64_t step_, items_;
  const int segments_;
  TokenDestinations srcs_{};
  uint64_t rest_ = 0;
};

// Aligned rows: bulk copies into the warp's buffers, kPullStages ahead.
template <typename Element>
__device__ void pull_reduce_bulk(const CombineParams& p, char* shared) {
  const KernelContext& c = p.ctx;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WarpStages stages(shared, warp);
  if (lane == 0) {
    for (int s = 0; s < kPullStages; ++s) barrier_init(stages.barriers + s);
    barrier_init_fence();
    fence_global_before_bulk_copies();  // the handshake's acquires
  }
  __syncwarp();
  const int segments = reduce_segments(p, true);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  PartialProducer producer(p, stages, first, step, items, segments);
  uint32_t issued = 0, consumed = 0;
  while (issued < kPullStages && producer.issue(issued)) ++issued;
  for (int64_t item = first; item < items; item += step) {
    const int segment = static_cast<int>(item % segments);
    const int vectors = reduce_segment_vectors(p, segment);
    SegmentSums<Element> sums;
    auto& acc = sums.v;
    // The item's partials are the next buffers whose item is this one (none:
    // every pick of the token was masked, the output row is zeros).
    while (consumed < issued && stages.items[consumed % kPullStages] == item) {
      const int stage = static_cast<int>(consumed % kPullStages);
      const bool landed = barrier_wait(stages.barriers + stage, (consumed / kPullStages) & 1u, c.state.timeout_ns);
      if (!__all_sync(0xFFFFFFFFu, landed)) {  // the whole warp leaves, after the copies it issued (bounded)
        if (lane == 0) record_timeout(c.control(), c.state.mirror, kPhaseCombine, stages.ranks[stage]);
        for (uint32_t n = consumed; n < issued; ++n) {
          barrier_wait(stages.barriers + n % kPullStages, (n / kPullStages) & 1u, c.state.timeout_ns);
        }
        return;
      }
      const uint4* buffer =
          reinterpret_cast<const uint4*>(stages.buffers + static_cast<size_t>(stage) * kReduceSegmentBytes);
      uint4 v[kReduceVectorsPerLane] = {};
#pragma unroll
      for (int u = 0; u < kReduceVectorsPerLane; ++u) {
        if (u * 32 + lane < vectors) v[u] = buffer[u * 32 + lane];
      }
      accumulate<Element>(acc, v);
      __syncwarp();  // every lane has read the buffer before it is refilled
      ++consumed;
      if (producer.issue(issued)) ++issued;
    }
    store_segment<Element>(p, static_cast<int32_t>(item / segments),
                           static_cast<int64_t>(segment) * kReduceSegmentBytes, vectors, acc, lane);
  }
}
#endif

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
