// A model of the general dispatch kernel's look-back routing
// (cuda/dispatch/, cuda/dispatch/lookback.h, docs/nvlink_backend.md
// "Routing by look-back"), run on the kernel's own arithmetic:
//
// Look-back: a block draws its logical index L from a ticket when it starts
// (the block that draws the last index resets the ticket for the next call),
// routes the tokens of share L, publishes one word per destination (the
// call's tag above its count), then waits until the words of blocks
// 0 .. L - 1 carry this call's tag and places its tokens after their counts.
// Calls vary their grid, and some route by scan (no ticket, no word, no tag).
// Checked under every start order the scheduler picks and any number of
// resident blocks: every block's prefix is the sum of its predecessors'
// counts, the ticket starts every call at 0, and every call ends (no
// deadlock).  Weakened variants must be caught: the block index instead of a
// ticket (a resident block waits for one that cannot start), a ready flag
// without the tag (a word of an earlier call is taken for this one's), no
// ticket reset, and, with a tag of a few bits standing in for the 32-bit one,
// no refresh of the words beyond a call's grid (a word written a multiple of
// the tag's period ago looks fresh).
//
// Padding from the back: no block knows the totals before it sends, so block
// L pads, in each destination's segment, one row per own token that does not
// go there, counted from the back of [0, T), and its share of [T, tpr).
// Checked over random routings, grids and tokens_per_rank: every row of
// [0, tpr) is written once, the real rows are [0, count) in ascending token
// order and the rest padding.  A weakened variant (the same rows counted from
// the front) must be caught.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "dispatch/lookback.h"
#include "dispatch/token_shares.h"

using moe_ep::kernels::block_padding_rows;
using moe_ep::kernels::block_tail_rows;
using moe_ep::kernels::kTokenShareUnit;
using moe_ep::kernels::lookback_count;
using moe_ep::kernels::lookback_word;
using moe_ep::kernels::lookback_word_is_current;
using moe_ep::kernels::own_token_range;

namespace {

// ---- Look-back ----

struct LookbackVariant {
  bool tickets = true;       // logical index from a ticket (else: the block index)
  bool tags = true;          // a word is this call's when it carries the tag (else: when it is nonzero)
  bool reset_ticket = true;  // the block that draws G - 1 sets the ticket back to 0
  bool refresh = true;       // the last block rewrites the words of blocks beyond its grid with its tag
  uint32_t tag_period = 0;   // tags modulo this (0: the kernel's 32 bits)
};

enum class BlockState { NotStarted, Started, Published, Placed };

struct Block {
  BlockState state = BlockState::NotStarted;
  int logical = -1;
};

// The device state that outlives a call.
struct GridMemory {
  int ticket = 0;
  uint32_t last_tag = 0;        // ControlBlock::lookback_tag
  std::vector<uint64_t> words;  // per logical index (one destination: the ranks' counts are independent)
  explicit GridMemory(int blocks) : words(static_cast<size_t>(blocks), 0) {}
};

// Runs `calls` calls on a handle whose largest grid is `max_blocks`, each of
// a random grid, at most `resident` blocks at once, each step chosen by `rng`
// among the possible ones.  Returns "" or what went wrong.
std::string run_lookback(int max_blocks, int resident, int calls, const LookbackVariant& v, std::mt19937& rng) {
  GridMemory memory(max_blocks);
  for (int call = 1; call <= calls; ++call) {
    const int blocks = 1 + static_cast<int>(rng() % static_cast<uint32_t>(max_blocks));
    if (rng() % 5 == 0) continue;  // a call routed by scan: no ticket, no word, no tag
    uint32_t tag = memory.last_tag + 1;
    if (v.tag_period != 0) tag %= v.tag_period;
    std::vector<uint32_t> counts(static_cast<size_t>(blocks));
    for (auto& c : counts) c = 1 + rng() % 50;  // rows of share L (never 0: a zero word must not look ready)
    std::vector<Block> grid(static_cast<size_t>(blocks));
    int done = 0;
    while (done < blocks) {
      int running = 0;
      for (const Block& b : grid) running += b.state != BlockState::NotStarted && b.state != BlockState::Placed;
      // The steps possible now: (block, what).
      std::vector<int> possible;
      for (int b = 0; b < blocks; ++b) {
        const Block& x = grid[static_cast<size_t>(b)];
        if (x.state == BlockState::NotStarted && running < resident) possible.push_back(b);
        if (x.state == BlockState::Started) possible.push_back(b);
        if (x.state == BlockState::Published) {
          bool ready = true;
          for (int j = 0; j < x.logical; ++j) {
            const uint64_t w = memory.words[static_cast<size_t>(j)];
            ready = ready && (v.tags ? lookback_word_is_current(w, tag) : w != 0);
          }
          if (ready) possible.push_back(b);
        }
      }
      if (possible.empty()) return "call " + std::to_string(call) + ": no block can move (deadlock)";
      Block& x = grid[static_cast<size_t>(possible[rng() % possible.size()])];
      const int b = static_cast<int>(&x - grid.data());
      switch (x.state) {
        case BlockState::NotStarted:  // start: draw the logical index
          x.logical = v.tickets ? memory.ticket++ : b;
          if (x.logical >= blocks) return "call " + std::to_string(call) + ": ticket " + std::to_string(x.logical);
          if (v.tickets && v.reset_ticket && x.logical == blocks - 1) memory.ticket = 0;
          x.state = BlockState::Started;
          break;
        case BlockState::Started:  // route its own tokens, publish the count
          memory.words[static_cast<size_t>(x.logical)] = lookback_word(tag, counts[static_cast<size_t>(x.logical)]);
          x.state = BlockState::Published;
          break;
        case BlockState::Published: {  // look back, place the tokens, finish
          uint64_t prefix = 0, expected = 0;
          for (int j = 0; j < x.logical; ++j) {
            prefix += lookback_count(memory.words[static_cast<size_t>(j)]);
            expected += counts[static_cast<size_t>(j)];
          }
          if (prefix != expected) {
            return "call " + std::to_string(call) + ": block " + std::to_string(x.logical) + " placed after " +
                   std::to_string(prefix) + " rows, expected " + std::to_string(expected);
          }
          if (v.refresh && x.logical == blocks - 1) {  // send_totals
            for (int j = blocks; j < max_blocks; ++j) memory.words[static_cast<size_t>(j)] = lookback_word(tag, 0);
          }
          x.state = BlockState::Placed;
          ++done;
          break;
        }
        case BlockState::Placed: break;
      }
    }
    memory.last_tag = tag;  // block 0, once every block has arrived
  }
  return "";
}

// Some scheduling (of many seeds) breaks the variant; "" when none does.
std::string first_failure(const LookbackVariant& v, int seeds, int calls = 6) {
  for (int blocks : {1, 2, 3, 5, 8}) {
    for (int resident = 1; resident <= blocks; ++resident) {
      for (int seed = 0; seed < seeds; ++seed) {
        std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + blocks * 131 + resident));
        const std::string failure = run_lookback(blocks, resident, calls, v, rng);
        if (!failure.empty()) {
          return std::to_string(blocks) + " blocks, " + std::to_string(resident) + " resident: " + failure;
        }
      }
    }
  }
  return "";
}

// ---- Padding from the back ----

constexpr int kPadding = -1;  // a row's content: the local token it holds, or padding
constexpr int kUnwritten = -2;

// One call: T tokens with random destinations on `world` ranks, G blocks with
// equal shares but the last's (a scan's last block may take less); returns ""
// or what went wrong with rank d's segment.
std::string run_padding(int world, int T, int tpr, int G, int32_t share_last, bool from_back, std::mt19937& rng) {
  std::vector<uint64_t> mask(static_cast<size_t>(T));
  for (auto& m : mask) m = rng() % (uint64_t{1} << world);  // any set, empty too
  for (int d = 0; d < world; ++d) {
    std::vector<int> rows(static_cast<size_t>(tpr), kUnwritten);
    std::vector<int> writes(static_cast<size_t>(tpr), 0);
    auto write = [&](int32_t r, int what) {
      if (r < 0 || r >= tpr) return;
      rows[static_cast<size_t>(r)] = what;
      ++writes[static_cast<size_t>(r)];
    };
    for (int L = 0; L < G; ++L) {
      int32_t t0, t1;
      own_token_range(T, G, L, kTokenShareUnit, share_last, &t0, &t1);
      int32_t before = 0, own = 0;
      for (int t = 0; t < t0; ++t) before += (mask[static_cast<size_t>(t)] >> d) & 1u;
      for (int t = t0; t < t1; ++t) {
        if ((mask[static_cast<size_t>(t)] >> d) & 1u) write(before + own++, t);  // the token's slot
      }
      int32_t r0, r1;
      block_padding_rows(T, t0, t1, before, own, &r0, &r1);
      if (!from_back) {  // the weakened variant: the same number of rows, counted from the front
        r1 = (t0 - before) + (r1 - r0);
        r0 = t0 - before;
      }
      for (int32_t r = r0; r < r1; ++r) write(r, kPadding);
      block_tail_rows(T, tpr, G, L, &r0, &r1);
      for (int32_t r = r0; r < r1; ++r) write(r, kPadding);
    }
    int expected_token = 0, count = 0;
    for (int t = 0; t < T; ++t) count += (mask[static_cast<size_t>(t)] >> d) & 1u;
    for (int r = 0; r < tpr; ++r) {
      int want = kPadding;
      if (r < count) {
        while (!((mask[static_cast<size_t>(expected_token)] >> d) & 1u)) ++expected_token;
        want = expected_token++;
      }
      if (writes[static_cast<size_t>(r)] != 1 || rows[static_cast<size_t>(r)] != want) {
        return "rank " + std::to_string(d) + " row " + std::to_string(r) + ": written " +
               std::to_string(writes[static_cast<size_t>(r)]) + " times, holds " +
               std::to_string(rows[static_cast<size_t>(r)]) + ", expected " + std::to_string(want);
      }
    }
  }
  return "";
}

std::string first_padding_failure(bool from_back, int seeds) {
  for (int world : {1, 2, 3, 8}) {
    for (int seed = 0; seed < seeds; ++seed) {
      std::mt19937 rng(static_cast<uint32_t>(seed * 104729 + world));
      const int tpr = 1 + static_cast<int>(rng() % 40);
      const int T = static_cast<int>(rng() % static_cast<uint32_t>(tpr + 1));
      const int G = 1 + static_cast<int>(rng() % 12);
      const int32_t share_last = rng() % 2 == 0 ? kTokenShareUnit : static_cast<int32_t>(rng() % (kTokenShareUnit + 1));
      const std::string failure = run_padding(world, T, tpr, G, share_last, from_back, rng);
      if (!failure.empty()) {
        return std::to_string(world) + " ranks, T " + std::to_string(T) + ", tpr " + std::to_string(tpr) + ", " +
               std::to_string(G) + " blocks: " + failure;
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("look-back model: tickets and tagged counts place every block, on any residency and grid, every call",
          "[protocol][lookback]") {
  const std::string failure = first_failure(LookbackVariant{}, 300);
  INFO(failure);
  REQUIRE(failure.empty());
  // A tag of 2 bits wraps every 4 look-back calls: the refresh keeps every word
  // at most one call old, so a wrapped tag is never taken for a fresh one.
  LookbackVariant short_tag;
  short_tag.tag_period = 4;
  const std::string wrapped = first_failure(short_tag, 100, 24);
  INFO(wrapped);
  REQUIRE(wrapped.empty());
}

TEST_CASE("look-back model: each weakened variant is caught", "[protocol][lookback]") {
  LookbackVariant block_index;
  block_index.tickets = false;
  CHECK(first_failure(block_index, 300).find("deadlock") != std::string::npos);
  LookbackVariant no_tag;
  no_tag.tags = false;
  CHECK(first_failure(no_tag, 300).find("placed after") != std::string::npos);
  LookbackVariant no_reset;
  no_reset.reset_ticket = false;
  CHECK(first_failure(no_reset, 300).find("ticket") != std::string::npos);
  LookbackVariant no_refresh;
  no_refresh.refresh = false;
  no_refresh.tag_period = 4;
  CHECK(first_failure(no_refresh, 100, 24).find("placed after") != std::string::npos);
}

TEST_CASE("padding model: every row is written once, real rows in token order, padding from the back",
          "[protocol][lookback]") {
  const std::string failure = first_padding_failure(true, 2000);
  INFO(failure);
  REQUIRE(failure.empty());
  CHECK_FALSE(first_padding_failure(false, 2000).empty());
}

TEST_CASE("tail rows: the blocks' chunks tile [T, tokens_per_rank) in order, up to 2^31 - 1 rows and 1024 blocks",
          "[protocol][lookback]") {
  const int32_t kMax = 2147483647;
  const int32_t cases[][3] = {{0, kMax, 1024}, {1, kMax, 1023}, {kMax, kMax, 7}, {5, 6, 1024},
                              {0, 1000, 3},    {128, 128, 1},   {3, 130, 128}};
  for (const auto& c : cases) {
    const int32_t T = c[0], tpr = c[1], G = c[2];
    INFO("T " << T << " tokens_per_rank " << tpr << " blocks " << G);
    int64_t next = T;  // each block's rows start where the previous block's ended
    for (int32_t L = 0; L < G; ++L) {
      int32_t r0, r1;
      block_tail_rows(T, tpr, G, L, &r0, &r1);
      REQUIRE(r0 == next);
      REQUIRE(r1 >= r0);
      REQUIRE(r1 <= tpr);
      next = r1;
    }
    REQUIRE(next == tpr);
  }
}
