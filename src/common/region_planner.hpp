// Placing regions one after another in a workspace or a record, each at an
// alignment, with every sum and product checked: the one place where the
// backends' buffer plans (nvlink/workspace_plan.*, nccl/nccl_workspace.*), the
// HOST backend's dispatch record and the NVLink allocation size round and add
// up bytes.  A size that does not fit in 64 bits throws `status`
// (INVALID_ARGUMENT unless told otherwise) with a message naming what
// overflowed, never a wrapped offset.
//
// A workspace of several buffer slots (config->micro_batches) holds whole
// copies of one slot's plan back to back: slot k starts at k x the slot's
// bytes, which the plan rounds to its alignment so that every slot is as
// aligned as slot 0.
#pragma once

#include <cstdint>

#include "error.hpp"

namespace moe_ep {

// `value` rounded up to a multiple of `alignment` (> 0; any value, not only a
// power of two: an allocation granularity is whatever the driver reports), or
// throws `status` saying that `what` overflows 64 bits.
inline uint64_t align_up(uint64_t value, uint64_t alignment, const char* what,
                         moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  if (alignment == 0) fail(MOE_EP_ERROR_INTERNAL, what, ": expected an alignment > 0, got 0");
  uint64_t sum = 0;
  if (__builtin_add_overflow(value, alignment - 1, &sum)) {
    fail(status, what, ": ", value, " rounded up to a multiple of ", alignment, " overflows 64 bits");
  }
  return sum / alignment * alignment;
}

// Regions placed in call order: each starts at the end of the one before,
// rounded up to the alignment (the first at `start`, rounded up), so a region
// of 0 bytes takes no room and starts where the next one does.
class RegionPlanner {
 public:
  RegionPlanner(const char* what, uint64_t alignment, uint64_t start = 0,
                moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT)
      : what_(what), alignment_(alignment), status_(status), next_(align_up(start, alignment, what, status)) {}

  // The offset of a region of `bytes` bytes.
  uint64_t place(uint64_t bytes) {
    const uint64_t at = next_;
    uint64_t end = 0;
    if (__builtin_add_overflow(at, bytes, &end)) {
      fail(status_, what_, ": a region of ", bytes, " bytes at offset ", at, " overflows 64 bits");
    }
    next_ = align_up(end, alignment_, what_, status_);
    return at;
  }

  // The end of the last region, rounded up to the alignment: the size of the whole.
  uint64_t end() const { return next_; }

 private:
  const char* what_;
  uint64_t alignment_;
  moe_ep_status_t status_;
  uint64_t next_;
};

// Where buffer slot `slot` (>= 0) starts in a workspace of copies of one
// slot's plan of `slot_bytes` bytes: the end of the `slot` slots before it.
inline uint64_t slot_start(uint64_t slot_bytes, int32_t slot, const char* what,
                           moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  if (slot < 0) fail(MOE_EP_ERROR_INTERNAL, what, ": expected a buffer slot >= 0, got ", slot);
  uint64_t at = 0;
  if (__builtin_mul_overflow(slot_bytes, static_cast<uint64_t>(slot), &at)) {
    fail(status, what, ": ", slot, " buffer slots of ", slot_bytes, " bytes each overflow 64 bits");
  }
  return at;
}

// The bytes of `slots` (>= 1) such copies.
inline uint64_t slots_bytes(uint64_t slot_bytes, int32_t slots, const char* what,
                            moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  if (slots < 1) fail(MOE_EP_ERROR_INTERNAL, what, ": expected at least 1 buffer slot, got ", slots);
  return slot_start(slot_bytes, slots, what, status);
}

}  // namespace moe_ep
