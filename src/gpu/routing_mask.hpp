// The active-rank mask as the dispatch kernels route by it
// (kernels::ControlBlock::masked_ranks): bit r set when rank r is inactive,
// so that its experts' picks are dropped, and every bit when this rank is
// inactive, so that all of its own picks are.  0 while every rank is active,
// which is also the zeroed workspace's value at create.
#pragma once

#include <cstdint>
#include <vector>

namespace moe_ep {

inline uint64_t masked_ranks(const std::vector<uint8_t>& active, int32_t rank) {
  if (!active[static_cast<size_t>(rank)]) return ~uint64_t{0};
  uint64_t masked = 0;
  for (size_t r = 0; r < active.size() && r < 64; ++r) {
    if (!active[r]) masked |= uint64_t{1} << r;
  }
  return masked;
}

// The ranks that take no part in the protocol (kernels::ControlBlock::
// absent_ranks) under failure_policy MASK, where the inactive ranks are out
// of every exchange: the inactive ones, and every other rank when this rank
// is inactive (it runs alone).  Never this rank's own bit.
inline uint64_t absent_ranks(const std::vector<uint8_t>& active, int32_t rank) {
  uint64_t absent = 0;
  const bool self_active = active[static_cast<size_t>(rank)] != 0;
  for (size_t r = 0; r < active.size() && r < 64; ++r) {
    if (static_cast<int32_t>(r) != rank && (!self_active || !active[r])) absent |= uint64_t{1} << r;
  }
  return absent;
}

}  // namespace moe_ep
