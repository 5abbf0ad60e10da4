// The general dispatch kernel's decoupled look-back (dispatch/lookback.cuh,
// docs/nvlink_backend.md "Routing by look-back"): plain C++ shared by the
// kernel and by the CPU model that checks it
// (test/nvlink/test_dispatch_lookback_model.cpp), so that the model runs the
// kernel's own arithmetic.
//
// A block takes its logical index L from a ticket, routes only its own tokens
// (share L of the rank's tokens, in order), and publishes for each
// destination one word: this call's tag and how many of its tokens go there.
// It then reads the words of blocks 0 .. L - 1 (which drew earlier tickets, so
// they are running and publish before they wait for anything) and places its
// tokens after theirs.  No block needs the totals for its rows, and neither
// for its padding: the real rows of a destination's segment fill it from the
// front, and each block pads, from the back of [0, T), one row per own token
// that does not go there; rows [T, tokens_per_rank) are padding in every
// segment and are split between the blocks.  So every row of [0, tpr) is
// written in every call, either by its token or as padding, as before.
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// Largest dispatch grid: the look-back words are [kMaxDispatchBlocks][world].
constexpr int32_t kMaxDispatchBlocks = 1024;

// A block's word for one destination: the call's tag above its count.  The
// tag numbers the general kernel's calls (ControlBlock::lookback_tag + 1,
// wrapping at 2^32; the small-batch kernel does not count): a word is this
// call's when its tag is.  Each call rewrites the words of the blocks beyond
// its grid with its tag (count 0), so every word is this call's or the
// previous one's, and a wrapped tag cannot be mistaken for a fresh one.
MOE_EP_HOST_DEVICE uint64_t lookback_word(uint32_t tag, uint32_t count) {
  return (static_cast<uint64_t>(tag) << 32) | static_cast<uint64_t>(count);
}
MOE_EP_HOST_DEVICE bool lookback_word_is_current(uint64_t word, uint32_t tag) {
  return static_cast<uint32_t>(word >> 32) == tag;
}
MOE_EP_HOST_DEVICE uint32_t lookback_count(uint64_t word) { return static_cast<uint32_t>(word); }

// Rows [*r0, *r1) of one destination's segment that the block owning tokens
// [t0, t1) of T pads: `before` of the tokens before t0 and `own` of its own go
// to that destination, so t0 - before earlier tokens do not, and t1 - t0 - own
// of its own do not.  Counted from the back of [0, T): the union over the
// blocks is [tokens going there, T), disjoint from the real rows.
MOE_EP_HOST_DEVICE void block_padding_rows(int32_t T, int32_t t0, int32_t t1, int32_t before, int32_t own, int32_t* r0,
                                           int32_t* r1) {
  *r0 = T - (t1 - before - own);
  *r1 = T - (t0 - before);
}

// Rows [*r0, *r1) of [T, tokens_per_rank) (padding in every segment) that
// block L of G pads: chunks of ceil(n / G) rows in block order.  One 32-bit
// division (n < 2^31, G <= kMaxDispatchBlocks): this sits on a small call's
// path just before the block's publication, where 64-bit divisions cost.
MOE_EP_HOST_DEVICE void block_tail_rows(int32_t T, int32_t tokens_per_rank, int32_t G, int32_t L, int32_t* r0,
                                        int32_t* r1) {
  const uint32_t n = static_cast<uint32_t>(tokens_per_rank - T);
  const uint32_t chunk = (n + static_cast<uint32_t>(G) - 1u) / static_cast<uint32_t>(G);
  const uint64_t begin = static_cast<uint64_t>(chunk) * static_cast<uint32_t>(L);
  const uint64_t end = begin + chunk;
  *r0 = T + static_cast<int32_t>(begin < n ? begin : n);
  *r1 = T + static_cast<int32_t>(end < n ? end : n);
}

}  // namespace kernels
}  // namespace moe_ep
