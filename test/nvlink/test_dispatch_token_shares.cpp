// How a dispatch grid shares its tokens (cuda/dispatch_token_shares.h): the
// blocks' ranges cover every token once, in order, for any share of block 0
// (the general kernel's even split, the small-batch kernel's empty block 0).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "dispatch_token_shares.h"

using moe_ep::kernels::kTokenShareUnit;
using moe_ep::kernels::own_token_range;

namespace {

struct Range {
  int32_t begin, end;
};

std::vector<Range> ranges(int32_t T, int32_t blocks, int32_t share0) {
  std::vector<Range> r(blocks);
  for (int32_t b = 0; b < blocks; ++b) own_token_range(T, blocks, b, share0, &r[b].begin, &r[b].end);
  return r;
}

// Every token exactly once, block after block.
void require_partition(const std::vector<Range>& r, int32_t T) {
  int32_t next = 0;
  for (const Range& x : r) {
    REQUIRE(x.begin == next);
    REQUIRE(x.end >= x.begin);
    next = x.end;
  }
  REQUIRE(next == T);
}

}  // namespace

TEST_CASE("the blocks' token ranges partition the tokens for every share of block 0", "[dispatch_shares]") {
  for (int32_t T : {0, 1, 5, 127, 128, 513, 4096, 32768, 65536}) {
    for (int32_t blocks : {1, 2, 3, 8, 24, 132, 1024}) {
      for (int32_t share0 : {0, 1, 100, 249, kTokenShareUnit}) {
        INFO("T " << T << " blocks " << blocks << " share " << share0);
        require_partition(ranges(T, blocks, share0), T);
      }
    }
  }
}

TEST_CASE("a full share is the even split; a zero share leaves block 0 empty", "[dispatch_shares]") {
  const std::vector<Range> even = ranges(4096, 24, kTokenShareUnit);
  for (int32_t b = 0; b < 24; ++b) {
    REQUIRE(even[b].begin == static_cast<int32_t>(int64_t{4096} * b / 24));
    REQUIRE(even[b].end == static_cast<int32_t>(int64_t{4096} * (b + 1) / 24));
  }
  const std::vector<Range> idle = ranges(4096, 24, 0);
  REQUIRE(idle[0].end == 0);
  for (int32_t b = 1; b < 24; ++b) REQUIRE(idle[b].end - idle[b].begin >= 4096 / 23);
  const std::vector<Range> one = ranges(77, 1, 0);  // a lone block sends everything whatever the share
  REQUIRE(one[0].begin == 0);
  REQUIRE(one[0].end == 77);
}
