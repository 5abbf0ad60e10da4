// How a dispatch grid shares its tokens (cuda/dispatch_token_shares.h): the
// blocks' ranges cover every token once, in order; block 0's share follows
// the model of its extra routing work (smaller on larger grids, none where
// its rows would be worth less than its delay), and an even split where the
// model says so.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "dispatch_token_shares.h"

using moe_ep::kernels::block_zero_token_share;
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

constexpr int64_t kDeepSeekBytes = 7168 * 2 + 8 * 8;  // bf16 row, ids and weights of top-8

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

TEST_CASE("block 0's share follows the model of its extra routing work", "[dispatch_shares]") {
  // DeepSeek rows on 2 ranks: f = G x 8 x 11.8 / (14400 x 2).
  REQUIRE(block_zero_token_share(1, 8, kDeepSeekBytes, 2) == kTokenShareUnit);
  const int32_t s8 = block_zero_token_share(8, 8, kDeepSeekBytes, 2);
  const int32_t s16 = block_zero_token_share(16, 8, kDeepSeekBytes, 2);
  const int32_t s132 = block_zero_token_share(132, 8, kDeepSeekBytes, 2);
  CHECK(s8 == 249);    // 2.6 % less: its ≈ 7 us over ≈ 263 us of sends
  CHECK(s16 == 242);   // 5.2 % less
  CHECK(s132 == 145);  // 43 % less
  REQUIRE(s8 > s16);
  REQUIRE(s16 > s132);
  REQUIRE(s132 > 0);
  // Tiny rows: routing outweighs any share of rows, block 0 owns none.
  REQUIRE(block_zero_token_share(66, 8, 16 + 64, 2) == 0);
  // More destinations per token make a share of rows worth more than the picks.
  REQUIRE(block_zero_token_share(132, 8, kDeepSeekBytes, 8) > s132);
  // Degenerate rows (no bytes) and single-pick routing stay within [0, unit].
  REQUIRE(block_zero_token_share(8, 1, 0, 2) == 0);
  const int32_t k1 = block_zero_token_share(8, 1, kDeepSeekBytes, 2);
  REQUIRE(k1 >= 0);
  REQUIRE(k1 <= kTokenShareUnit);
}
