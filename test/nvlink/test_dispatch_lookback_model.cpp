// A model of the dispatch routing as proposed to take the routing scan off
// the path (docs/nvlink_backend.md, "What is left", 4096-token dispatch,
// design (b)), checked before it is built, as test_reuse_protocol_model.cpp
// checked the zero-copy combine:
//
// Look-back: a block draws its logical index L from a ticket when it starts
// (the block that draws the last index resets the ticket for the next call),
// routes the tokens of share L, publishes one word per destination, (call
// epoch << 32) | its count, then waits until the words of blocks 0 .. L - 1
// carry this call's epoch and places its tokens after their counts.  Checked
// under every start order the scheduler picks and any number of resident
// blocks: every block's prefix is the sum of its predecessors' counts, the
// ticket starts every call at 0, and every call ends (no deadlock).  Weakened
// variants must be caught: the block index instead of a ticket (a resident
// block waits for one that cannot start), a ready flag without the epoch (a
// word of the previous call is taken for this one's), no ticket reset.
//
// Padding by the receiver: the senders no longer know the totals, so after
// its waits the receiver pads the rows between each source's new count and
// the previous call's, or every source's whole tail when tokens_per_rank
// changed; create pads everything once.  Checked over random sequences of
// counts and tokens_per_rank: after every call the rows [count, tpr) of every
// segment are padding and the rows below are this call's.  Weakened variants
// (no full re-pad on a new tokens_per_rank; a previous count never updated)
// must be caught.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace {

// ---- Look-back ----

struct LookbackVariant {
  bool tickets = true;       // logical index from a ticket (else: the block index)
  bool epoch_tags = true;    // a word is this call's when it carries the epoch (else: when it is nonzero)
  bool reset_ticket = true;  // the block that draws G - 1 sets the ticket back to 0
};

enum class BlockState { NotStarted, Started, Published, Placed };

struct Block {
  BlockState state = BlockState::NotStarted;
  int logical = -1;
};

// The device state that outlives a call.
struct GridMemory {
  int ticket = 0;
  std::vector<uint64_t> words;  // per logical index (one destination: the ranks' counts are independent)
  explicit GridMemory(int blocks) : words(static_cast<size_t>(blocks), 0) {}
};

// Runs `calls` calls of a grid of `blocks` blocks, at most `resident` at once,
// each step chosen by `rng` among the possible ones.  Returns "" or what went
// wrong.
std::string run_lookback(int blocks, int resident, int calls, const LookbackVariant& v, std::mt19937& rng) {
  GridMemory memory(blocks);
  for (int call = 1; call <= calls; ++call) {
    std::vector<uint32_t> counts(static_cast<size_t>(blocks));
    for (auto& c : counts) c = 1 + rng() % 50;  // rows of share L (never 0: a zero word must not look ready)
    std::vector<Block> grid(static_cast<size_t>(blocks));
    const uint64_t epoch = static_cast<uint64_t>(call);
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
            ready = ready && (v.epoch_tags ? (w >> 32) == epoch : w != 0);
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
          memory.words[static_cast<size_t>(x.logical)] = (epoch << 32) | counts[static_cast<size_t>(x.logical)];
          x.state = BlockState::Published;
          break;
        case BlockState::Published: {  // look back, place the tokens, finish
          uint64_t prefix = 0, expected = 0;
          for (int j = 0; j < x.logical; ++j) {
            prefix += memory.words[static_cast<size_t>(j)] & 0xFFFFFFFFu;
            expected += counts[static_cast<size_t>(j)];
          }
          if (prefix != expected) {
            return "call " + std::to_string(call) + ": block " + std::to_string(x.logical) + " placed after " +
                   std::to_string(prefix) + " rows, expected " + std::to_string(expected);
          }
          x.state = BlockState::Placed;
          ++done;
          break;
        }
        case BlockState::Placed: break;
      }
    }
  }
  return "";
}

// Some scheduling (of many seeds) breaks the variant; "" when none does.
std::string first_failure(const LookbackVariant& v, int seeds) {
  for (int blocks : {1, 2, 3, 5, 8}) {
    for (int resident = 1; resident <= blocks; ++resident) {
      for (int seed = 0; seed < seeds; ++seed) {
        std::mt19937 rng(static_cast<uint32_t>(seed * 7919 + blocks * 131 + resident));
        const std::string failure = run_lookback(blocks, resident, 4, v, rng);
        if (!failure.empty()) {
          return std::to_string(blocks) + " blocks, " + std::to_string(resident) + " resident: " + failure;
        }
      }
    }
  }
  return "";
}

// ---- Padding by the receiver ----

struct PaddingVariant {
  bool repad_on_new_tpr = true;  // a new tokens_per_rank re-pads every tail
  bool remember_counts = true;   // the previous counts are updated after every call
};

constexpr int kPadding = 0;  // a row's content: 0 = padding, n = real row of call n

std::string run_padding(int world, int max_tokens, int calls, const PaddingVariant& v, std::mt19937& rng) {
  std::vector<int> rows(static_cast<size_t>(world) * max_tokens, kPadding);  // create pads everything
  std::vector<int> previous(static_cast<size_t>(world), 0);
  int previous_tpr = max_tokens;
  for (int call = 1; call <= calls; ++call) {
    const int tpr = rng() % 4 == 0 ? 1 + static_cast<int>(rng() % max_tokens) : previous_tpr;
    std::vector<int> count(static_cast<size_t>(world));
    for (auto& c : count) c = static_cast<int>(rng() % (tpr + 1));
    // The senders write the real rows only.
    for (int s = 0; s < world; ++s) {
      for (int r = 0; r < count[static_cast<size_t>(s)]; ++r) rows[static_cast<size_t>(s * tpr + r)] = call;
    }
    // The receiver, after its waits.
    for (int s = 0; s < world; ++s) {
      const int c = count[static_cast<size_t>(s)];
      const int end = tpr != previous_tpr && v.repad_on_new_tpr ? tpr : std::min(previous[static_cast<size_t>(s)], tpr);
      for (int r = c; r < end; ++r) rows[static_cast<size_t>(s * tpr + r)] = kPadding;
      if (v.remember_counts) previous[static_cast<size_t>(s)] = c;
    }
    previous_tpr = tpr;
    // The invariant the results promise (docs/semantics.md §4).
    for (int s = 0; s < world; ++s) {
      for (int r = 0; r < tpr; ++r) {
        const int want = r < count[static_cast<size_t>(s)] ? call : kPadding;
        if (rows[static_cast<size_t>(s * tpr + r)] != want) {
          return "call " + std::to_string(call) + " (tpr " + std::to_string(tpr) + "): source " + std::to_string(s) +
                 " row " + std::to_string(r) + " holds " + std::to_string(rows[static_cast<size_t>(s * tpr + r)]) +
                 ", expected " + std::to_string(want);
        }
      }
    }
  }
  return "";
}

std::string first_padding_failure(const PaddingVariant& v, int seeds) {
  for (int world : {1, 2, 3, 8}) {
    for (int seed = 0; seed < seeds; ++seed) {
      std::mt19937 rng(static_cast<uint32_t>(seed * 104729 + world));
      const std::string failure = run_padding(world, 9, 30, v, rng);
      if (!failure.empty()) return std::to_string(world) + " ranks: " + failure;
    }
  }
  return "";
}

}  // namespace

TEST_CASE("look-back model: tickets and epoch-tagged counts place every block, on any residency, every call",
          "[protocol][lookback]") {
  const std::string failure = first_failure(LookbackVariant{}, 300);
  INFO(failure);
  REQUIRE(failure.empty());
}

TEST_CASE("look-back model: each weakened variant is caught", "[protocol][lookback]") {
  LookbackVariant block_index;
  block_index.tickets = false;
  CHECK(first_failure(block_index, 300).find("deadlock") != std::string::npos);
  LookbackVariant no_epoch;
  no_epoch.epoch_tags = false;
  CHECK(first_failure(no_epoch, 300).find("placed after") != std::string::npos);
  LookbackVariant no_reset;
  no_reset.reset_ticket = false;
  CHECK(first_failure(no_reset, 300).find("ticket") != std::string::npos);
}

TEST_CASE("receiver padding model: rows past each count are padding after every call", "[protocol][lookback]") {
  const std::string failure = first_padding_failure(PaddingVariant{}, 300);
  INFO(failure);
  REQUIRE(failure.empty());
  PaddingVariant no_full_repad;
  no_full_repad.repad_on_new_tpr = false;
  CHECK_FALSE(first_padding_failure(no_full_repad, 300).empty());
  PaddingVariant stale_counts;
  stale_counts.remember_counts = false;
  CHECK_FALSE(first_padding_failure(stale_counts, 300).empty());
}
