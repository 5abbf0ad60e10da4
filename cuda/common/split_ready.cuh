// The ready word of a split call (docs/overlap.md, "NVLink backend").
//
// A receive half waits for its peers with a stream memory operation, which
// holds no SM, before its kernel runs; that wait compares one word with a
// value fixed when it is enqueued (or captured), so it cannot wait for the
// epoch-numbered counters the kernels use.  Each send-half block therefore
// also adds its arrival weight to the destination's ready word of the slot,
// after the same fence as its counter adds; the word reaches
// ready_target(world) when every peer's blocks have published, and the
// receive kernel takes that much back once its own bounded waits (on the
// epoch-numbered counters, which are what orders the rows) have passed.  The
// next call's adds come only after that: a peer sends its next call on the
// slot only after seeing this rank's next publication, which follows this
// receive in stream order.
//
// The stream wait only keeps the SMs free: correctness never depends on it,
// since the receive kernel waits (bounded) for the counters itself.
#pragma once

#include <stdint.h>

#include "common/device_sync.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

// Thread 0, after its fence.acq_rel.sys: this block's weight into every
// peer's ready word at `ready_offset` (this rank's own blocks are ordered
// before its receive by the stream).  An absent peer (ControlBlock::
// absent_ranks) gets nothing and adds nothing here, so this rank adds that
// peer's share to its own word: the target stays the same whatever the mask
// (a captured graph waits for the same value).
// `absent`: ControlBlock::absent_ranks, read by the caller before its barrier
// (off the critical path).
template <typename Context>
__device__ inline void add_ready_at_peers(const Context& c, uint64_t ready_offset, uint32_t weight, uint64_t absent) {
  const int world = c.shape.world_size;
  for (int i = 1; i < world; ++i) {
    const int d = (c.shape.rank + i) % world;
    if (((absent >> d) & 1u) == 0) red_relaxed_sys_add(c.template remote<uint32_t>(d, ready_offset), weight);
  }
  if (absent != 0) red_relaxed_sys_add(c.template local<uint32_t>(ready_offset), weight * __popcll(absent));
}

// One thread of the receive kernel, after its waits for the peers passed (or
// gave up): takes back this call's weights from the ready word, then tells
// the host's watchdog that the slot's receive finished: completed first, then
// waiting cleared, with no fence between them (a system fence behind a store
// to host memory would sit on every receive's critical path; the watchdog
// looks for a stall of timeout_ms, far longer than either store takes to land).
template <typename Context>
__device__ inline void end_receive(const Context& c, uint64_t ready_offset) {
  atomicSub(c.template local<uint32_t>(ready_offset), ready_target(c.shape.world_size));
  ControlBlock* control = c.control();
  const uint32_t done = control->receives_done + 1;
  control->receives_done = done;
  ReceiveWatch& watch = c.state.mirror->watch[c.state.slot];
  watch.completed = done;
  watch.waiting = 0;
}

}  // namespace kernels
}  // namespace moe_ep
