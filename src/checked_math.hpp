// Overflow-checked size arithmetic.  Every byte count, element count and
// offset that the library derives from caller or peer input goes through these
// helpers, so that a huge or hostile value becomes a clear error instead of a
// wrapped size (and then an out-of-bounds access).
//
// The throwing helpers report INVALID_ARGUMENT by default (the caller's values
// are too large); pass another status where the input came from a peer
// (INVALID_INPUT).  The try_* helpers never throw, for noexcept code and for
// code that wants to choose its own message (the NVLink backend may use them).
// Rounding up and placing regions at an alignment: common/region_planner.hpp.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "error.hpp"

namespace moe_ep {

// Largest byte count any per-rank buffer layout may reach.  Far above any real
// machine (64 PiB), and far enough below 2^64 that a backend may add a handful
// of such sizes plus alignment padding without overflowing uint64_t.
constexpr uint64_t kMaxLayoutBytes = uint64_t{1} << 56;

inline bool try_mul(uint64_t a, uint64_t b, uint64_t* out) noexcept { return !__builtin_mul_overflow(a, b, out); }
inline bool try_add(uint64_t a, uint64_t b, uint64_t* out) noexcept { return !__builtin_add_overflow(a, b, out); }
inline bool try_mul(int64_t a, int64_t b, int64_t* out) noexcept { return !__builtin_mul_overflow(a, b, out); }
inline bool try_add(int64_t a, int64_t b, int64_t* out) noexcept { return !__builtin_add_overflow(a, b, out); }

// a * b, or throws `status` saying that `what` does not fit in 64 bits.
inline uint64_t checked_mul(uint64_t a, uint64_t b, const std::string& what,
                            moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  uint64_t r = 0;
  if (!try_mul(a, b, &r)) fail(status, what, ": ", a, " x ", b, " overflows 64 bits");
  return r;
}

inline uint64_t checked_add(uint64_t a, uint64_t b, const std::string& what,
                            moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  uint64_t r = 0;
  if (!try_add(a, b, &r)) fail(status, what, ": ", a, " + ", b, " overflows 64 bits");
  return r;
}

inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what,
                           moe_ep_status_t status = MOE_EP_ERROR_INVALID_ARGUMENT) {
  int64_t r = 0;
  if (!try_mul(a, b, &r)) fail(status, what, ": ", a, " x ", b, " overflows int64");
  return r;
}

// `value` as a size_t that a std::vector can hold, or OUT_OF_MEMORY.
inline size_t checked_size(uint64_t value, const std::string& what) {
  if (value > static_cast<uint64_t>(std::numeric_limits<std::ptrdiff_t>::max())) {
    fail(MOE_EP_ERROR_OUT_OF_MEMORY, what, ": ", value, " bytes cannot be allocated");
  }
  return static_cast<size_t>(value);
}

}  // namespace moe_ep
