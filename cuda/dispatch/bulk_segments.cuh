// The bulk-copy segment policy of the send path (compute capability 9.0).
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "common/bulk_store_ring.cuh"
#include "dispatch/register_segments.cuh"
#include "dispatch/row_send.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// BulkSegments (compute capability 9.0, 16-byte aligned rows): lane 0 of each
// warp forwards its segments through a ring of kBulkStages shared-memory
// buffers (BulkStoreRing): each segment is read from HBM once with a bulk copy
// and written to every destination with bulk copies, kBulkStages - 1 segments
// read ahead; the first ones are read before routing.  The other lanes take
// part only in the warp-collective reads of the destinations.
constexpr int kBulkStages = 3;
// Dynamic shared memory of a block (also known to the host code, which has no
// __CUDA_ARCH__): each warp's buffers and barriers.
constexpr size_t kBulkSegmentsSharedBytes = size_t{kWarpsPerBlock} * kBulkStages * (kSegmentBytes + sizeof(uint64_t));
#ifdef MOE_EP_HAVE_BULK_COPY
using SegmentRing = BulkStoreRing<kBulkStages, kSegmentBytes>;
static_assert(kBulkSegmentsSharedBytes == kWarpsPerBlock * (SegmentRing::kBufferBytes + SegmentRing::kBarrierBytes),
              "the ring's layout");

class BulkSegments {
 public:
  __device__ BulkSegments(const DispatchParams& p, int t0, int t1, char* shared)
      : p_(p),
        items_(p, t0, t1),
        ring_(shared + static_cast<size_t>(threadIdx.x / 32) * SegmentRing::kBufferBytes,
              reinterpret_cast<uint64_t*>(shared + kWarpsPerBlock * SegmentRing::kBufferBytes) +
                  static_cast<size_t>(threadIdx.x / 32) * kBulkStages),
        next_item_(first_segment_item()) {}
  static constexpr size_t kSharedBytes = kBulkSegmentsSharedBytes;

  __device__ void start() {
    if (threadIdx.x % 32 != 0 || !items_.aligned) return;
    ring_.init();
    while (loaded_ < kBulkStages - 1 && load_next()) {
    }
  }
  // The loads already issued land before the block leaves.
  __device__ void abandon() {
    if (threadIdx.x % 32 == 0) ring_.drain_loads(loaded_, stored_, p_.ctx.state.timeout_ns);
  }
  // Segment items come in the order start() and load_next() walked them.
  __device__ void send(int, int32_t, int segment, const TokenDestinations& dests, int lane) {
    const GroupShape& s = p_.ctx.shape;
    const uint32_t n = stored_++;
    const bool landed = lane != 0 || failed_ || ring_.wait_loaded(n, p_.ctx.state.timeout_ns);
    if (!landed) {  // a local read that never finished: recorded, the warp sends no more segments
      record_timeout(p_.ctx.control(), p_.ctx.state.mirror, kPhaseDispatch, s.rank);
      failed_ = true;
    }
    // The buffer was written by the bulk load (seen through the barrier) and
    // is read by the bulk stores: order the two across the proxies.
    if (lane == 0 && !failed_) fence_shared_before_bulk_copy();
    const uint32_t bytes = static_cast<uint32_t>(segment_vectors(s, segment)) * 16u;
    const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
    for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
      const int d = lowest_rank(rest);
      const int64_t row = static_cast<int64_t>(s.rank) * p_.args.tokens_per_rank + dests.slot(d);  // every lane
      if (lane == 0 && !failed_) {
        ring_.store(n, p_.ctx.rank_base(d) + p_.ctx.offsets.recv_hidden + row * s.hidden_row_bytes + offset, bytes);
      }
    }
    if (lane == 0 && !failed_) {
      ring_.end_stores();
      load_next();
    }
  }
  __device__ void finish() {
    if (threadIdx.x % 32 == 0 && items_.aligned) ring_.wait_all_written();
  }

 private:
  __device__ int first_segment_item() const {
    const int item = threadIdx.x / 32;
    return items_.is_segment(item) || item >= items_.count ? item : following_segment_item(item);
  }
  __device__ int following_segment_item(int item) const {
    do {
      item += kWarpsPerBlock;
    } while (item < items_.count && !items_.is_segment(item));
    return item;
  }
  // Lane 0: reads the warp's next segment item into the ring; false when
  // there is none.
  __device__ bool load_next() {
    if (next_item_ >= items_.count) return false;
    const GroupShape& s = p_.ctx.shape;
    const int32_t token = items_.t0 + next_item_ / items_.parts;
    const int segment = next_item_ % items_.parts;
    const char* src = static_cast<const char*>(p_.args.hidden) + static_cast<int64_t>(token) * s.hidden_row_bytes +
                      static_cast<int64_t>(segment) * kSegmentBytes;
    ring_.load(loaded_++, src, static_cast<uint32_t>(segment_vectors(s, segment)) * 16u);
    next_item_ = following_segment_item(next_item_);
    return true;
  }

  const DispatchParams& p_;
  const OwnItems items_;
  SegmentRing ring_;
  int next_item_;        // lane 0: the next segment item to load
  uint32_t loaded_ = 0;  // lane 0: segments loaded
  uint32_t stored_ = 0;  // every lane: segments sent (ring slot numbers)
  bool failed_ = false;  // lane 0: a load timed out
};
#else
// Device code for an architecture without bulk copies (a build whose lowest
// architecture is below 9.0, run on a newer device): the register path, the
// shared memory given at launch unused.
class BulkSegments : public RegisterSegments {
 public:
  static constexpr size_t kSharedBytes = kBulkSegmentsSharedBytes;
  __device__ BulkSegments(const DispatchParams& p, int t0, int t1, char* shared)
      : RegisterSegments(p, t0, t1, shared) {}
};
#endif

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
