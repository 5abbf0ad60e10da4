// The register segment policy of the send path.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/row_send.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// How a warp moves the aligned segments of its items: a policy of the one
// send path (send_own_tokens), chosen per call on the host
// (DispatchLaunch::bulk_rows).  Each policy has
//   kSharedBytes     the dynamic shared memory its kernels are launched with;
//   start()          before routing: work that does not depend on it;
//   abandon()        instead of sending, when the call does no work;
//   send(...)        one segment item, to the ranks `dests` names;
//   finish()         after the warp's last item, before the block publishes:
//                    every store written and ordered like an ordinary store.
//
// RegisterSegments: a segment is loaded into registers, then stored to every
// destination; the first segment of each warp is loaded before routing so
// that its latency hides behind the scan.
class RegisterSegments {
 public:
  __device__ RegisterSegments(const DispatchParams& p, int t0, int t1, char*) : p_(p), items_(p, t0, t1) {}
  static constexpr size_t kSharedBytes = 0;

  __device__ void start() {
    const int item = threadIdx.x / 32;
    prefetched_ = items_.is_segment(item);
    if (prefetched_) load_segment(p_, items_.t0 + item / items_.parts, item % items_.parts, threadIdx.x % 32, first_);
  }
  __device__ void abandon() {}
  __device__ void send(int item, int32_t token, int segment, const TokenDestinations& dests, int lane) {
    if (item == threadIdx.x / 32 && prefetched_) {
      store_segment(p_, segment, dests, lane, first_);
      return;
    }
    uint4 v[kVectorsPerLane];
    load_segment(p_, token, segment, lane, v);
    store_segment(p_, segment, dests, lane, v);
  }
  __device__ void finish() {}

 private:
  const DispatchParams& p_;
  const OwnItems items_;
  bool prefetched_ = false;
  uint4 first_[kVectorsPerLane];
};

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
