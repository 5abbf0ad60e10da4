// The row ranges a pipelined NCCL dispatch or combine is cut into
// (src/nccl/nccl_chunk_plan.hpp): every rank must derive the same NCCL calls
// from tokens_per_rank and the chunk count, the ranges must cover each segment
// exactly once in ascending order, and the tokens a range completes must have
// every row inside the ranges moved so far.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "common/tuning_registry.hpp"
#include "nccl/nccl_chunk_plan.hpp"

using moe_ep::kMaxNcclChunks;
using moe_ep::nccl_tokens_complete_after;
using moe_ep::NcclChunkPlan;
using moe_ep::NcclTokenRange;
using moe_ep::plan_nccl_chunks;

TEST_CASE("NCCL chunk plan: one chunk is the whole segment", "[nccl][chunks]") {
  const NcclChunkPlan p = plan_nccl_chunks(4096, 1);
  REQUIRE(p.count == 1);
  CHECK(p.ranges[0].first == 0);
  CHECK(p.ranges[0].rows == 4096);
}

TEST_CASE("NCCL chunk plan: balanced ranges, fewer when tokens_per_rank is below the chunk count", "[nccl][chunks]") {
  NcclChunkPlan p = plan_nccl_chunks(4096, 4);
  REQUIRE(p.count == 4);
  for (int c = 0; c < 4; ++c) {
    CHECK(p.ranges[c].first == 1024 * c);
    CHECK(p.ranges[c].rows == 1024);
  }
  p = plan_nccl_chunks(10, 4);  // [0,2) [2,5) [5,7) [7,10)
  REQUIRE(p.count == 4);
  CHECK(p.ranges[0].first == 0);
  CHECK(p.ranges[0].rows == 2);
  CHECK(p.ranges[1].first == 2);
  CHECK(p.ranges[1].rows == 3);
  CHECK(p.ranges[2].first == 5);
  CHECK(p.ranges[2].rows == 2);
  CHECK(p.ranges[3].first == 7);
  CHECK(p.ranges[3].rows == 3);
  p = plan_nccl_chunks(3, 4);
  REQUIRE(p.count == 3);
  for (int c = 0; c < 3; ++c) CHECK(p.ranges[c].rows == 1);
  p = plan_nccl_chunks(0, 4);  // one empty range: callers keep one code path
  REQUIRE(p.count == 1);
  CHECK(p.ranges[0].rows == 0);
}

TEST_CASE("NCCL chunk plan: chunk counts outside [1, 16] are clamped", "[nccl][chunks]") {
  CHECK(plan_nccl_chunks(100, 0).count == 1);
  CHECK(plan_nccl_chunks(100, -5).count == 1);
  CHECK(plan_nccl_chunks(100, 17).count == kMaxNcclChunks);
  CHECK(plan_nccl_chunks(100, 1000).count == kMaxNcclChunks);
}

TEST_CASE("NCCL chunk plan: every segment row in exactly one range; tokens complete when their range arrived",
          "[nccl][chunks]") {
  for (int32_t tpr = 1; tpr <= 300; ++tpr) {
    for (int32_t chunks = 1; chunks <= kMaxNcclChunks; ++chunks) {
      const NcclChunkPlan p = plan_nccl_chunks(tpr, chunks);
      INFO("tpr " << tpr << " chunks " << chunks);
      REQUIRE(p.count == std::min(chunks, tpr));
      int64_t next = 0, smallest = tpr, largest = 0;
      for (int32_t c = 0; c < p.count; ++c) {
        REQUIRE(p.ranges[c].first == next);
        REQUIRE(p.ranges[c].rows > 0);
        smallest = std::min(smallest, p.ranges[c].rows);
        largest = std::max(largest, p.ranges[c].rows);
        next += p.ranges[c].rows;
      }
      REQUIRE(next == tpr);
      REQUIRE(largest - smallest <= 1);
      // Token ranges: disjoint, ascending, covering [0, num_tokens); a token of
      // range c (slot <= its index) has its rows in ranges 0..c.
      for (int32_t tokens : {0, 1, tpr / 2, tpr - 1, tpr}) {
        if (tokens < 0) continue;
        int32_t covered = 0;
        for (int32_t c = 0; c < p.count; ++c) {
          const NcclTokenRange t = nccl_tokens_complete_after(p, c, tokens);
          REQUIRE(t.begin <= t.end);
          if (t.begin == t.end) continue;
          REQUIRE(t.begin == covered);
          REQUIRE(t.end - 1 < p.ranges[c].first + p.ranges[c].rows);  // the highest slot of these tokens
          covered = t.end;
        }
        REQUIRE(covered == tokens);
      }
    }
  }
}

TEST_CASE("NCCL chunk counts from the environment: the registry's range is the plan's", "[nccl][chunks]") {
  for (const moe_ep::Knob k : {moe_ep::Knob::kNcclDispatchChunks, moe_ep::Knob::kNcclCombineChunks}) {
    const moe_ep::KnobSpec& s = moe_ep::knob_spec(k);
    INFO(s.name);
    CHECK(s.min == 1);
    CHECK(s.max == moe_ep::kMaxNcclChunks);
    CHECK(s.default_value == 1);  // one NCCL group, no overlap
  }
}
