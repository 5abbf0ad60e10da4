// Counter-based random numbers: a value is a pure function of (key, index), so
// every rank can regenerate any rank's inputs, any row, in any order, from the
// seed alone.  SplitMix64's finaliser is a good enough mixer for test data.
#pragma once

#include <cstdint>

namespace moe_ep_verify {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A key for a stream of values: derive(derive(seed, rank), purpose), ...
inline uint64_t derive(uint64_t key, uint64_t part) { return mix64(key ^ mix64(part + 0x632BE59BD9B4E019ull)); }

// Element `index` of the stream `key`.
inline uint64_t draw(uint64_t key, uint64_t index) { return mix64(key + index * 0xD1B54A32D192ED03ull); }

// Uniform in [0, 1), 53 random bits.
inline double draw_unit(uint64_t key, uint64_t index) {
  return static_cast<double>(draw(key, index) >> 11) * (1.0 / 9007199254740992.0);
}

// A sequential generator for when a row needs a variable number of draws.
class Sequence {
 public:
  explicit Sequence(uint64_t key) : key_(key) {}
  uint64_t next() { return draw(key_, at_++); }
  double unit() { return draw_unit(key_, at_++); }
  // Uniform integer in [0, n), n > 0 (the modulo bias is irrelevant here).
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t key_;
  uint64_t at_ = 0;
};

}  // namespace moe_ep_verify
