// Model check of the whole-row pull combine's protocol (cuda/combine/pull_rows.cuh,
// pull_reduce_whole_rows) on the kernel's own schedule (PullRowsSchedule):
// 1 to 4 producer warps, each with a ring of buffers and their "full" and
// "empty" barriers, each step carrying up to two partial rows of a token (one
// copy each, landing on the buffer's one barrier), and consumer threads that
// take the block's tokens in order.  Barriers are modelled as the hardware
// keeps them (a count of completed phases; a wait names the parity of the
// phase it waits for), each copy lands at any later moment, and a random scheduler interleaves every actor.  Checked:
// a parity wait never passes on a phase other than the one meant (two phases
// apart look the same), no buffer is refilled before every consumer released
// it, every consumer sees each token's partials in ascending rank order and
// nothing else, the slot buffers fit and do not overlap, and every run ends
// (no deadlock).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "combine/pull_rows_schedule.h"

using moe_ep::kernels::kRowMaxStages;
using moe_ep::kernels::kSlotRegionInts;
using moe_ep::kernels::PullRowsSchedule;

namespace {

constexpr int kMaxWorld = 64;  // the kernels' kMaxWorldSize (moe_ep_kernels.h, which needs the CUDA headers)

struct Barrier {
  uint32_t completed = 0;  // phases completed
  uint32_t arrivals = 0;   // in the current phase
  // mbarrier.try_wait.parity: true once the phase of that parity completed,
  // i.e. while the phase in progress has the other parity.
  bool passes(uint32_t parity) const { return (completed & 1u) != parity; }
  void arrive(uint32_t expected) {
    if (++arrivals == expected) {
      arrivals = 0;
      ++completed;
    }
  }
};

struct Step {
  int32_t token = -1;
  bool last = false, empty = false;
  int rows = 0;  // partial rows carried: 0 (empty), 1 or 2
};

struct Model {
  PullRowsSchedule plan;
  int32_t t0, t1;
  int consumers;
  std::vector<uint64_t> masks;  // ranks holding a partial, per token of [t0, t1)
  Barrier full[kRowMaxStages], empty[kRowMaxStages];
  Step steps[kRowMaxStages];
  int32_t buffer_token[kRowMaxStages], buffer_rank[kRowMaxStages][2];
  int pending[kRowMaxStages] = {};  // copies of the buffer's step not landed yet
  struct Copy {
    int stage, row, rank;
  };
  std::vector<Copy> in_flight;  // row copies that have not landed
  // Producers.
  std::vector<uint32_t> produced;  // steps issued, per producer
  std::vector<int32_t> next_n;     // next token index, per producer
  std::vector<uint64_t> rest;      // ranks still to issue for the current token
  std::vector<bool> started;       // whether the current token's ranks were loaded
  // Consumers.
  struct Consumer {
    int32_t t;
    uint32_t taken[moe_ep::kernels::kRowMaxProducers] = {};
    uint64_t seen = 0;
    int last_rank = -1;
  };
  std::vector<Consumer> readers;

  Model(int producers, int stages, int32_t t0_, int32_t t1_, int consumers_, std::vector<uint64_t> masks_)
      : plan(PullRowsSchedule::make(producers, stages)),
        t0(t0_),
        t1(t1_),
        consumers(consumers_),
        masks(std::move(masks_)) {
    produced.assign(plan.producers, 0);
    next_n.assign(plan.producers, 0);
    rest.assign(plan.producers, 0);
    started.assign(plan.producers, false);
    readers.assign(consumers, Consumer{t0});
  }

  bool producer_done(int j) const { return next_n[j] >= plan.tokens_of(j, t0, t1); }

  // Producer j's next step, if its wait for the buffer passes.
  bool try_produce(int j) {
    if (producer_done(j)) return false;
    const int32_t t = plan.token(j, next_n[j], t0);
    REQUIRE(plan.producer_of(t, t0) == j);
    REQUIRE(t < t1);
    if (!started[j]) {
      rest[j] = masks[t - t0];
      started[j] = true;
    }
    const uint32_t k = produced[j];
    const int s = plan.stage(j, k);
    REQUIRE(s >= j * plan.ring);
    REQUIRE(s < (j + 1) * plan.ring);
    const uint32_t use = plan.use(k);
    if (use > 0) {
      if (!empty[s].passes((use - 1) & 1u)) return false;
      // The wait passed: the previous use was released by every consumer,
      // and not an older one that happens to have the same parity.
      REQUIRE(empty[s].completed == use);
    }
    REQUIRE(full[s].completed == use);  // the previous use of the buffer landed and was consumed
    if (rest[j] == 0) {                 // no partial: an empty step
      steps[s] = Step{t, true, true};
      full[s].arrive(1);
    } else {  // up to two partials, the lowest ranks left, each its own copy on the one barrier
      int rows = 0;
      while (rows < 2 && rest[j] != 0) {
        const int q = __builtin_ctzll(rest[j]);
        rest[j] &= rest[j] - 1;
        in_flight.push_back(Copy{s, rows, q});
        ++rows;
      }
      steps[s] = Step{t, rest[j] == 0, false, rows};
      pending[s] = rows;
      buffer_token[s] = -2;  // being written
    }
    ++produced[j];
    if (rest[j] == 0) {
      ++next_n[j];
      started[j] = false;
    }
    return true;
  }

  // One row copy lands; the buffer's barrier completes with its last copy.
  void land(size_t i) {
    const Copy copy = in_flight[i];
    const int s = copy.stage;
    buffer_rank[s][copy.row] = copy.rank;
    in_flight.erase(in_flight.begin() + static_cast<std::ptrdiff_t>(i));
    REQUIRE(pending[s] > 0);
    if (--pending[s] == 0) {
      buffer_token[s] = steps[s].token;
      full[s].arrive(1);
    }
  }

  // Consumer c's next step, if its wait for the buffer passes.
  bool try_consume(int c) {
    Consumer& r = readers[c];
    if (r.t >= t1) return false;
    const int j = plan.producer_of(r.t, t0);
    const uint32_t k = r.taken[j];
    const int s = plan.stage(j, k);
    if (!full[s].passes(plan.parity(k))) return false;
    REQUIRE(full[s].completed == plan.use(k) + 1);  // this use landed, not an older or newer one
    const Step step = steps[s];
    REQUIRE(step.token == r.t);
    const uint64_t mask = masks[r.t - t0];
    if (step.empty) {
      REQUIRE(mask == 0);
    } else {
      REQUIRE(buffer_token[s] == r.t);
      REQUIRE(step.rows >= 1);
      REQUIRE(step.rows <= 2);
      for (int row = 0; row < step.rows; ++row) {  // the kernel adds the first half, then the second
        const int q = buffer_rank[s][row];
        REQUIRE(q > r.last_rank);  // ascending rank order
        REQUIRE(((mask >> q) & 1u) == 1u);
        r.last_rank = q;
        r.seen |= uint64_t{1} << q;
      }
    }
    empty[s].arrive(static_cast<uint32_t>(consumers));
    r.taken[j] = k + 1;
    if (step.last) {
      REQUIRE(r.seen == mask);  // every partial of the token, none twice (ascending), nothing else
      r.seen = 0;
      r.last_rank = -1;
      ++r.t;
    }
    return true;
  }

  bool done() const {
    for (int j = 0; j < plan.producers; ++j) {
      if (!producer_done(j)) return false;
    }
    for (const Consumer& r : readers) {
      if (r.t < t1) return false;
    }
    return in_flight.empty();
  }

  // Random interleaving until every actor is done; false on a deadlock.
  bool run(std::mt19937& rng) {
    for (;;) {
      if (done()) return true;
      std::vector<int> actors;  // 0..P-1 producers, P.. landings, then consumers
      const int P = plan.producers;
      const int landings = static_cast<int>(in_flight.size());
      for (int a = 0; a < P + landings + consumers; ++a) actors.push_back(a);
      std::shuffle(actors.begin(), actors.end(), rng);
      bool moved = false;
      for (int a : actors) {
        if (a < P) {
          moved = try_produce(a);
        } else if (a < P + landings) {
          land(static_cast<size_t>(a - P));
          moved = true;
        } else {
          moved = try_consume(a - P - landings);
        }
        if (moved) break;
      }
      if (!moved) return false;
    }
  }
};

}  // namespace

// The buffer counts the kernel uses: rows of 16 KiB, DeepSeek rows (14 KiB),
// 15 and 16 buffers (smaller rows), and the fewest every producer count allows.
const std::vector<int> kStageCounts = {moe_ep::kernels::row_stages_that_fit(16384),
                                       moe_ep::kernels::row_stages_that_fit(14336), 15, kRowMaxStages,
                                       moe_ep::kernels::kRowMaxProducers};

TEST_CASE("pull rows schedule: as many row buffers as fit, aligned, for every row size", "[pull]") {
  using moe_ep::kernels::kRowBufferBytes;
  using moe_ep::kernels::kRowStageAlign;
  CHECK(moe_ep::kernels::row_stages_that_fit(16384) == 6);  // buffers of two rows
  CHECK(moe_ep::kernels::row_stages_that_fit(14336) == 7);  // hidden 7168 in bf16
  CHECK(moe_ep::kernels::row_stages_that_fit(16) == kRowMaxStages);
  for (int row = 16; row <= moe_ep::kernels::kRowMaxBytes; row += 16) {
    INFO("row bytes " << row);
    const int bytes = moe_ep::kernels::row_stage_bytes(row);
    const int stages = moe_ep::kernels::row_stages_that_fit(row);
    REQUIRE(bytes >= row);
    REQUIRE(bytes % kRowStageAlign == 0);
    REQUIRE(bytes - row < kRowStageAlign);
    REQUIRE(stages >= moe_ep::kernels::kRowMaxProducers);
    REQUIRE(stages <= kRowMaxStages);
    REQUIRE(static_cast<int64_t>(stages) * 2 * bytes <= kRowBufferBytes);
    REQUIRE((stages == kRowMaxStages || static_cast<int64_t>(stages + 1) * 2 * bytes > kRowBufferBytes));
  }
}

TEST_CASE("pull rows schedule: the step-by-step position equals stage(j, k) and use(k)", "[pull]") {
  for (int requested = 1; requested <= moe_ep::kernels::kRowMaxProducers; ++requested) {
    for (int stages : kStageCounts) {
      const PullRowsSchedule plan = PullRowsSchedule::make(requested, stages);
      for (int j = 0; j < plan.producers; ++j) {
        PullRowsSchedule::Position at = plan.start(j);
        for (uint32_t k = 0; k < 5u * static_cast<uint32_t>(plan.ring) + 3u; ++k) {
          INFO("producers " << plan.producers << ", producer " << j << ", step " << k);
          REQUIRE(at.stage == plan.stage(j, k));
          REQUIRE(at.use == plan.use(k));
          REQUIRE(at.parity() == plan.parity(k));
          at = plan.next(j, at);
        }
      }
    }
  }
}

TEST_CASE("pull rows schedule: producers own disjoint rings and cover the block's tokens once, in order", "[pull]") {
  for (int requested = -1; requested <= 6; ++requested) {
    for (int stages : kStageCounts) {
      const PullRowsSchedule plan = PullRowsSchedule::make(requested, stages);
      INFO("requested " << requested << ", stages " << stages);
      REQUIRE(plan.producers >= 1);
      REQUIRE(plan.producers <= moe_ep::kernels::kRowMaxProducers);
      REQUIRE(plan.ring >= 1);
      REQUIRE(plan.stages() <= stages);
      REQUIRE(plan.stages() > stages - plan.producers);  // fewer than one buffer per producer left unused
      for (int32_t t0 : {0, 5}) {
        for (int32_t tokens = 0; tokens <= 13; ++tokens) {
          std::vector<int> owner(static_cast<size_t>(tokens), -1);
          for (int j = 0; j < plan.producers; ++j) {
            int32_t previous = -1;
            for (int32_t n = 0; n < plan.tokens_of(j, t0, t0 + tokens); ++n) {
              const int32_t t = plan.token(j, n, t0);
              REQUIRE(t > previous);
              REQUIRE(t >= t0);
              REQUIRE(t < t0 + tokens);
              REQUIRE(owner[static_cast<size_t>(t - t0)] == -1);
              REQUIRE(plan.producer_of(t, t0) == j);
              owner[static_cast<size_t>(t - t0)] = j;
              previous = t;
            }
          }
          for (int o : owner) REQUIRE(o >= 0);
        }
      }
      std::vector<std::set<int>> owners(static_cast<size_t>(plan.stages()));  // each buffer: exactly one producer
      for (int j = 0; j < plan.producers; ++j) {
        for (uint32_t k = 0; k < 3u * static_cast<uint32_t>(plan.ring); ++k) {
          const int s = plan.stage(j, k);
          REQUIRE(s >= 0);
          REQUIRE(s < plan.stages());
          owners[static_cast<size_t>(s)].insert(j);
        }
      }
      for (const std::set<int>& o : owners) REQUIRE(o.size() == 1);
    }
  }
}

TEST_CASE("pull rows schedule: each producer's two slot buffers fit, apart, for every world size", "[pull]") {
  for (int producers = 1; producers <= moe_ep::kernels::kRowMaxProducers; ++producers) {
    const PullRowsSchedule plan = PullRowsSchedule::make(producers, kRowMaxStages);
    for (int world = 1; world <= kMaxWorld; ++world) {
      INFO("producers " << producers << ", world " << world);
      const int32_t batch = plan.slot_batch(world);
      REQUIRE(batch >= 1);
      REQUIRE(batch <= moe_ep::kernels::kSlotBatchMaxTokens);
      REQUIRE(batch * world <= plan.slot_buffer_ints());
      std::vector<int> used(kSlotRegionInts, 0);
      for (int j = 0; j < producers; ++j) {
        for (int b = 0; b < 2; ++b) {
          const int32_t at = plan.slot_buffer_offset(j, b);
          REQUIRE(at >= 0);
          REQUIRE(at + batch * world <= kSlotRegionInts);
          for (int32_t i = 0; i < batch * world; ++i) REQUIRE(++used[static_cast<size_t>(at + i)] == 1);
        }
      }
    }
  }
}

TEST_CASE("pull rows protocol: every interleaving sampled delivers each token's partials in order, no deadlock",
          "[pull]") {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 3000; ++trial) {
    const int producers = 1 + trial % 4;
    const int stages = kStageCounts[static_cast<size_t>(rng() % kStageCounts.size())];
    const int world = std::vector<int>{1, 2, 3, 5, 8, 64}[static_cast<size_t>(trial / 4 % 6)];
    const int32_t t0 = static_cast<int32_t>(rng() % 7);
    const int32_t tokens = static_cast<int32_t>(rng() % 41);
    const int consumers = 1 + static_cast<int>(rng() % 3);
    std::vector<uint64_t> masks(static_cast<size_t>(tokens));
    for (uint64_t& m : masks) {
      const uint64_t all = world == 64 ? ~uint64_t{0} : (uint64_t{1} << world) - 1;
      switch (rng() % 4) {
        case 0: m = 0; break;    // every pick masked: an empty step
        case 1: m = all; break;  // a partial from every rank (64 steps on one ring at world 64)
        default: m = ((uint64_t{rng()} << 32) | rng()) & all; break;
      }
    }
    INFO("trial " << trial << ": producers " << producers << ", stages " << stages << ", world " << world << ", tokens "
                  << tokens << ", consumers " << consumers);
    Model model(producers, stages, t0, t0 + tokens, consumers, masks);
    REQUIRE(model.run(rng));
  }
}
