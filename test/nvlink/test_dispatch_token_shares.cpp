// How a dispatch grid shares its tokens (cuda/dispatch/token_shares.h): the
// blocks' ranges cover every token once, in order, for any share of the first
// and the last block (the small-batch kernel's empty block 0, the scan's
// smaller last block); the last block's share follows the model of its extra
// work (smaller on larger grids, none where its rows would be worth less than
// its delay); the small-batch kernel's block 0's share follows the model of
// its fixed extra work (none on small calls, nearly a full one on few SMs).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "dispatch/token_shares.h"

using moe_ep::kernels::kTokenShareUnit;
using moe_ep::kernels::own_token_range;
using moe_ep::kernels::scan_last_block_share;
using moe_ep::kernels::small_first_block_share;

namespace {

struct Range {
  int32_t begin, end;
};

std::vector<Range> ranges(int32_t T, int32_t blocks, int32_t share_first, int32_t share_last = kTokenShareUnit) {
  std::vector<Range> r(blocks);
  for (int32_t b = 0; b < blocks; ++b) own_token_range(T, blocks, b, share_first, share_last, &r[b].begin, &r[b].end);
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

TEST_CASE("the blocks' token ranges partition the tokens for every share of the first and last block",
          "[dispatch_shares]") {
  for (int32_t T : {0, 1, 5, 127, 128, 513, 4096, 32768, 65536}) {
    for (int32_t blocks : {1, 2, 3, 8, 24, 132, 1024}) {
      for (int32_t first : {0, 1, 100, 249, kTokenShareUnit}) {
        for (int32_t last : {0, 1, 171, kTokenShareUnit}) {
          INFO("T " << T << " blocks " << blocks << " shares " << first << ", " << last);
          require_partition(ranges(T, blocks, first, last), T);
        }
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

TEST_CASE("a smaller last share leaves the last block fewer tokens, the others even", "[dispatch_shares]") {
  const std::vector<Range> r = ranges(4096, 66, kTokenShareUnit, 128);  // half a share
  const int32_t middle = r[10].end - r[10].begin;
  REQUIRE(r[65].end - r[65].begin <= middle / 2 + 1);
  for (int32_t b = 0; b < 65; ++b) REQUIRE(r[b].end - r[b].begin >= middle - 1);
  const std::vector<Range> none = ranges(4096, 66, kTokenShareUnit, 0);
  REQUIRE(none[65].begin == 4096);
  REQUIRE(none[64].end == 4096);
  const std::vector<Range> both = ranges(10, 2, 0, 0);  // nobody owns a share: the last block takes all
  REQUIRE(both[0].end == 0);
  REQUIRE(both[1].end == 10);
}

TEST_CASE("the scan's last block's share follows the model of its extra routing work", "[dispatch_shares]") {
  constexpr int64_t kDeepSeekBytes = 7168 * 2 + 8 * 8;  // bf16 row, ids and weights of top-8
  // f = G x (8 x 11.8 + 49) / (14400 x 2)
  REQUIRE(scan_last_block_share(1, 8, kDeepSeekBytes, 2) == kTokenShareUnit);
  const int32_t s16 = scan_last_block_share(16, 8, kDeepSeekBytes, 2);
  const int32_t s66 = scan_last_block_share(66, 8, kDeepSeekBytes, 2);
  const int32_t s132 = scan_last_block_share(132, 8, kDeepSeekBytes, 2);
  CHECK(s16 == 235);  // 8 % less
  CHECK(s66 == 171);  // 33 % less: ≈ 10 us of extra routing over ≈ 32 us of sends
  CHECK(s132 == 87);  // 66 % less
  REQUIRE(s16 > s66);
  REQUIRE(s66 > s132);
  REQUIRE(s132 > 0);
  REQUIRE(scan_last_block_share(66, 8, 16 + 64, 2) == 0);            // tiny rows: routing outweighs any share
  REQUIRE(scan_last_block_share(132, 8, kDeepSeekBytes, 8) > s132);  // more destinations: rows worth more
  REQUIRE(scan_last_block_share(8, 1, 0, 2) == 0);
}

TEST_CASE("the small-batch kernel's block 0's share follows the model of its fixed extra work", "[dispatch_shares]") {
  constexpr int64_t kDeepSeekBytes = 7168 * 2 + 8 * 8;
  // g = 56000 / ((T / G) x 14400 x d)
  REQUIRE(small_first_block_share(1, 1, 8, kDeepSeekBytes, 2) == kTokenShareUnit);  // a lone block
  for (int32_t t : {0, 1, 8, 32, 128}) {  // small calls on the grids they get (a block per token or more): none
    for (int32_t blocks : {t < 2 ? 2 : t, 132}) {
      INFO("tokens " << t << " blocks " << blocks);
      REQUIRE(small_first_block_share(blocks, t, 8, kDeepSeekBytes, 2) == 0);
    }
  }
  CHECK(small_first_block_share(8, 512, 8, kDeepSeekBytes, 2) == 248);    // 3 % less: 1.8 MB of sends per share
  CHECK(small_first_block_share(8, 512, 8, kDeepSeekBytes, 1) == 240);    // one rank: 6 % less
  CHECK(small_first_block_share(132, 512, 8, kDeepSeekBytes, 2) == 127);  // half: 112 KB per share
  CHECK(small_first_block_share(132, 512, 8, kDeepSeekBytes, 1) == 0);    // 56 KB per share: none
  REQUIRE(small_first_block_share(16, 512, 8, kDeepSeekBytes, 2) <
          small_first_block_share(8, 512, 8, kDeepSeekBytes, 2));
  REQUIRE(small_first_block_share(16, 256, 8, kDeepSeekBytes, 2) <
          small_first_block_share(16, 512, 8, kDeepSeekBytes, 2));
  REQUIRE(small_first_block_share(16, 512, 8, 16 + 64, 2) == 0);  // tiny rows: the counts outweigh any share
  REQUIRE(small_first_block_share(8, 512, 1, kDeepSeekBytes, 8) <
          small_first_block_share(8, 512, 8, kDeepSeekBytes, 8));
}
