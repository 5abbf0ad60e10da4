// The health poll and the active-rank mask (docs/semantics.md, "Active
// ranks"; docs/reliability.md, "The health poll"): the poll never blocks and
// reports a sticky failure, its struct grows both ways, the mask round-trips,
// a disagreement or a call in the middle of a pair is refused on every rank,
// and with a rank inactive every rank's results equal the oracle run on the
// same inputs with that rank's experts (and its tokens) masked, in every
// receive layout, fused and split, with an FP8 wire and a runtime max.
// HOST backend, ranks as threads.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "counting_backend.hpp"
#include "handle.hpp"
#include "masked_round.hpp"
#include "moe_ep_c.h"
#include "oracle.hpp"
#include "rank_checks.hpp"
#include "rank_handles.hpp"
#include "rank_pair.hpp"
#include "result_reader.hpp"
#include "small_workload.hpp"
#include "tensor_view.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"
#include "workload.hpp"

using namespace moe_ep_test;
using namespace moe_ep_verify;
using Catch::Matchers::Contains;

namespace {

moe_ep_config_t config_of(int32_t timeout_ms = 30000) {
  moe_ep_config_t c = host_config();
  c.timeout_ms = timeout_ms;
  return c;
}

moe_ep_handle_t create(const moe_ep_bootstrap_t& b, const WorkloadSpec& w) {
  moe_ep_params_t p = w.params();
  const moe_ep_config_t c = config_of();
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) return nullptr;
  return h;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// One rank's round under `active`: dispatch and combine (fused or split),
// every result checked against the oracle run on the masked routing.
std::string masked_round(const moe_ep_bootstrap_t& b, const WorkloadSpec& w, int rank,
                         const std::vector<uint8_t>& active, bool split) {
  moe_ep_handle_t h = create(b, w);
  if (h == nullptr) return std::string("create: ") + moe_ep_last_error();
  const std::vector<RankRouting> masked = mask_routing(w, make_all_routing(w), active);
  RankPair pair(w, rank);  // the unmasked routing: the library masks it
  moe_ep_dispatch_result_t r;
  moe_ep_dispatch_result_init(&r, sizeof r);
  moe_ep_combine_result_t cr;
  moe_ep_combine_result_init(&cr, sizeof cr);
  if (pair.ok(moe_ep_set_active_ranks(h, active.data(), w.world), "set_active_ranks")) {
    const bool dispatched = split ? pair.ok(moe_ep_dispatch_send(h, 0, pair.args.get(), nullptr), "dispatch_send") &&
                                        pair.ok(moe_ep_dispatch_recv(h, 0, &r, nullptr), "dispatch_recv")
                                  : pair.ok(moe_ep_dispatch(h, pair.args.get(), &r, nullptr), "dispatch");
    if (dispatched) {
      pair.check_dispatch_result(r, masked);
      const bool combined = split ? pair.ok(moe_ep_combine_send(h, 0, pair.eo.get(), nullptr), "combine_send") &&
                                        pair.ok(moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr), "combine_recv")
                                  : pair.ok(moe_ep_combine(h, pair.eo.get(), nullptr, &cr, nullptr), "combine");
      if (combined) pair.check_combine_result(cr, masked);
    }
  }
  moe_ep_destroy(&h);
  return pair.problems;
}

void check_masked(const WorkloadSpec& w, const std::vector<uint8_t>& active, bool split) {
  INFO(w.describe() << (split ? ", split" : ", fused"));
  std::vector<std::string> problems(static_cast<size_t>(w.world));
  run_ranks(w.world, [&](int rank, const moe_ep_bootstrap_t& b) {
    problems[static_cast<size_t>(rank)] = masked_round(b, w, rank, active, split);
  });
  for (int r = 0; r < w.world; ++r) {
    INFO("rank " << r);
    CHECK(problems[static_cast<size_t>(r)] == "");
  }
}

}  // namespace

TEST_CASE("active ranks: the health poll of a healthy handle, without blocking", "[mask]") {
  with_rank_handles(small_workload(2, 7), config_of(), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    moe_ep_status_t rc = MOE_EP_ERROR_INTERNAL;
    const moe_ep_health_t health = poll_health(h, &rc);
    RANK_CHECK(checks, rank, rc == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, health.struct_size == sizeof(moe_ep_health_t));
    RANK_CHECK(checks, rank, health.status == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, health.failed_rank == -1);
    RANK_CHECK(checks, rank, health.active_count == 2);
    RANK_CHECK(checks, rank, health.mask_epoch == 0);
    // Host loads only: ten thousand polls take far less than one exchange would.
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 10000; ++i) poll_health(h);
    const double ms = ms_since(start);
    RANK_CHECK(checks, rank, ms < 200.0);
    std::printf("rank %d: %.0f ns per health poll\n", rank, ms * 1e6 / 10000);  // a figure, not a bound
  });
}

TEST_CASE("active ranks: the health struct grows both ways", "[mask]") {
  run_ranks(1, [&](int, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, small_workload(1, 3));
    REQUIRE(h != nullptr);
    // Exactly struct_size bytes are written: nothing past them.  (An older,
    // smaller layout exists once the struct grows; below the first released
    // layout a size is refused, see below.)
    unsigned char exact[sizeof(moe_ep_health_t) + 16];
    std::memset(exact, 0xAB, sizeof exact);
    REQUIRE(moe_ep_health_init(reinterpret_cast<moe_ep_health_t*>(exact), sizeof(moe_ep_health_t)) == MOE_EP_SUCCESS);
    REQUIRE(moe_ep_poll_health(h, reinterpret_cast<moe_ep_health_t*>(exact)) == MOE_EP_SUCCESS);
    moe_ep_health_t seen{};
    std::memcpy(&seen, exact, sizeof seen);
    CHECK(seen.struct_size == sizeof(moe_ep_health_t));
    CHECK(seen.status == MOE_EP_SUCCESS);
    CHECK(seen.failed_rank == -1);
    CHECK(seen.active_count == 1);
    CHECK(seen.mask_epoch == 0);
    for (size_t i = sizeof(moe_ep_health_t); i < sizeof exact; ++i) CHECK(exact[i] == 0xAB);
    // A newer, larger caller: the tail this library does not know reads zero.
    unsigned char large[sizeof(moe_ep_health_t) + 16];
    std::memset(large, 0xCD, sizeof large);
    REQUIRE(moe_ep_health_init(reinterpret_cast<moe_ep_health_t*>(large), sizeof large) == MOE_EP_SUCCESS);
    REQUIRE(moe_ep_poll_health(h, reinterpret_cast<moe_ep_health_t*>(large)) == MOE_EP_SUCCESS);
    for (size_t i = sizeof(moe_ep_health_t); i < sizeof large; ++i) CHECK(large[i] == 0);
    // A size inside a field, or past the largest accepted, is refused naming the struct.
    moe_ep_health_t bad;
    CHECK(moe_ep_health_init(&bad, 6) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(moe_ep_health_init(&bad, offsetof(moe_ep_health_t, mask_epoch)) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("moe_ep_health_t"));
    CHECK(moe_ep_health_init(&bad, 4096) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(moe_ep_health_init(nullptr, sizeof bad) == MOE_EP_ERROR_INVALID_ARGUMENT);
    bad.struct_size = 6;
    CHECK(moe_ep_poll_health(h, &bad) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("health"));
    moe_ep_destroy(&h);
  });
}

TEST_CASE("active ranks: the poll reports a sticky TIMEOUT at once", "[mask]") {
  const WorkloadSpec w = small_workload(2, 11);
  with_rank_handles(w, config_of(200), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    if (rank == 0) {  // rank 1 never dispatches
      RankPair pair(w, rank);
      moe_ep_dispatch_result_t r;
      moe_ep_dispatch_result_init(&r, sizeof r);
      RANK_CHECK(checks, rank, moe_ep_dispatch(h, pair.args.get(), &r, nullptr) == MOE_EP_ERROR_TIMEOUT);
      const auto start = std::chrono::steady_clock::now();
      moe_ep_status_t rc = MOE_EP_ERROR_INTERNAL;
      const moe_ep_health_t health = poll_health(h, &rc);
      RANK_CHECK(checks, rank, ms_since(start) < 50.0);
      RANK_CHECK(checks, rank, rc == MOE_EP_SUCCESS);  // the poll itself succeeded
      RANK_CHECK(checks, rank, health.status == MOE_EP_ERROR_TIMEOUT);
      RANK_CHECK(checks, rank, std::string(moe_ep_last_error()).find("timeout_ms = 200") != std::string::npos);
      // The HOST exchange cannot tell which peer is missing: no rank is named.
      RANK_CHECK(checks, rank, health.failed_rank == -1);
      RANK_CHECK(checks, rank, poll_health(h).status == MOE_EP_ERROR_TIMEOUT);  // sticky
      const uint8_t all[2] = {1, 1};
      RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, all, 2) == MOE_EP_ERROR_TIMEOUT);  // refused too
    }
  });
}

TEST_CASE("active ranks: get and set round-trip, and every update counts", "[mask]") {
  with_rank_handles(small_workload(4, 5), config_of(), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    uint8_t got[4] = {9, 9, 9, 9};
    RANK_CHECK(checks, rank, moe_ep_get_active_ranks(h, got, 4) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, got[0] == 1 && got[1] == 1 && got[2] == 1 && got[3] == 1);
    const uint8_t three[4] = {1, 1, 0, 7};  // any non-zero is active
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, three, 4) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_get_active_ranks(h, got, 4) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, got[0] == 1 && got[1] == 1 && got[2] == 0 && got[3] == 1);
    moe_ep_health_t health = poll_health(h);
    RANK_CHECK(checks, rank, health.active_count == 3 && health.mask_epoch == 1);
    const uint8_t all[4] = {1, 1, 1, 1};
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, all, 4) == MOE_EP_SUCCESS);
    health = poll_health(h);
    RANK_CHECK(checks, rank, health.active_count == 4 && health.mask_epoch == 2);
    // Local argument checks of get (no collective).
    RANK_CHECK(checks, rank, moe_ep_get_active_ranks(h, got, 3) == MOE_EP_ERROR_INVALID_ARGUMENT);
    RANK_CHECK(checks, rank, std::string(moe_ep_last_error()).find("world_size") != std::string::npos);
    RANK_CHECK(checks, rank, moe_ep_get_active_ranks(h, nullptr, 4) == MOE_EP_ERROR_INVALID_ARGUMENT);
  });
}

TEST_CASE("active ranks: a disagreement or a bad argument on one rank fails on every rank", "[mask]") {
  with_rank_handles(small_workload(4, 6), config_of(), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    // Rank 3 drops rank 1, the others rank 2.
    const uint8_t mine[4] = {1, 1, 0, 1}, other[4] = {1, 0, 1, 1};
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, rank == 3 ? other : mine, 4) == MOE_EP_ERROR_INVALID_ARGUMENT);
    RANK_CHECK(checks, rank, std::string(moe_ep_last_error()).find("rank 3") != std::string::npos);
    // Rank 1 passes a wrong world_size: it names the argument, the others rank 1.
    const moe_ep_status_t s = moe_ep_set_active_ranks(h, mine, rank == 1 ? 5 : 4);
    const std::string message = moe_ep_last_error();
    RANK_CHECK(checks, rank, s == MOE_EP_ERROR_INVALID_ARGUMENT);
    RANK_CHECK(checks, rank, message.find(rank == 1 ? "world_size" : "rank 1") != std::string::npos);
    // Every rank inactive.
    const uint8_t none[4] = {0, 0, 0, 0};
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, none, 4) == MOE_EP_ERROR_INVALID_ARGUMENT);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, nullptr, 4) == MOE_EP_ERROR_INVALID_ARGUMENT);
    // Nothing changed, and the handle still works.
    const moe_ep_health_t health = poll_health(h);
    RANK_CHECK(checks, rank, health.status == MOE_EP_SUCCESS && health.mask_epoch == 0 && health.active_count == 4);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, mine, 4) == MOE_EP_SUCCESS);
  });
}

TEST_CASE("active ranks: an update between a dispatch and its combine is refused on every rank", "[mask]") {
  const WorkloadSpec w = small_workload(3, 8);
  with_rank_handles(w, config_of(), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    RankPair pair(w, rank);
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    const uint8_t two[3] = {1, 0, 1};
    RANK_REQUIRE(checks, rank, moe_ep_dispatch(h, pair.args.get(), &r, nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, two, 3) == MOE_EP_ERROR_INVALID_STATE);
    RANK_CHECK(checks, rank, std::string(moe_ep_last_error()).find("DISPATCHED") != std::string::npos);
    RANK_CHECK(checks, rank, moe_ep_combine(h, pair.eo.get(), nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
    // Split: after dispatch_send, and after combine_send.
    RANK_REQUIRE(checks, rank, moe_ep_dispatch_send(h, 0, pair.args.get(), nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, two, 3) == MOE_EP_ERROR_INVALID_STATE);
    RANK_CHECK(checks, rank, moe_ep_dispatch_recv(h, 0, &r, nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_combine_send(h, 0, pair.eo.get(), nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, two, 3) == MOE_EP_ERROR_INVALID_STATE);
    RANK_CHECK(checks, rank, moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, poll_health(h).mask_epoch == 0);
    RANK_CHECK(checks, rank, moe_ep_set_active_ranks(h, two, 3) == MOE_EP_SUCCESS);  // between pairs
  });
}

TEST_CASE("active ranks: with rank 2 inactive every rank's results equal the masked oracle", "[mask]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const std::vector<uint8_t> active = {1, 1, 0, 1};
  std::vector<WorkloadSpec> specs;
  for (int layout : {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    WorkloadSpec w = small_workload(4, seed + static_cast<uint64_t>(layout));
    w.receive_layout = layout;
    w.eplb_stats = true;
    specs.push_back(w);
    WorkloadSpec fp8 = w;  // both FP8 wires and a runtime max
    fp8.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    fp8.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    fp8.runtime_max_tokens_per_rank = 6;
    fp8.seed = seed * 3 + static_cast<uint64_t>(layout);
    specs.push_back(fp8);
  }
  WorkloadSpec one = small_workload(4, seed + 17);  // only rank 0 left
  for (const WorkloadSpec& w : specs) {
    for (bool split : {false, true}) check_masked(w, active, split);
  }
  check_masked(one, {1, 0, 0, 0}, false);
}

TEST_CASE("active ranks: the C API names every bad argument", "[mask][validation]") {
  moe_ep_health_t health;
  REQUIRE(moe_ep_health_init(&health, sizeof health) == MOE_EP_SUCCESS);
  CHECK(health.struct_size == sizeof health);
  CHECK(health.failed_rank == -1);
  CHECK(moe_ep_poll_health(nullptr, &health) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("handle") && Contains("NULL"));
  uint8_t mask[1] = {1};
  CHECK(moe_ep_get_active_ranks(nullptr, mask, 1) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("handle"));
  CHECK(moe_ep_set_active_ranks(nullptr, mask, 1) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("handle"));
  run_ranks(1, [&](int, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, small_workload(1, 2));
    REQUIRE(h != nullptr);
    CHECK(moe_ep_poll_health(h, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("health") && Contains("NULL"));
    CHECK(moe_ep_get_active_ranks(h, nullptr, 1) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("active") && Contains("NULL"));
    CHECK(moe_ep_get_active_ranks(h, mask, 2) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("world_size") && Contains("1") && Contains("2"));
    CHECK(moe_ep_set_active_ranks(h, mask, 0) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("world_size"));
    const uint8_t none[1] = {0};
    CHECK(moe_ep_set_active_ranks(h, none, 1) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("at least one rank active"));
    CHECK(moe_ep_set_active_ranks(h, mask, 1) == MOE_EP_SUCCESS);
    CHECK(moe_ep_poll_health(h, &health) == MOE_EP_SUCCESS);
    CHECK(health.mask_epoch == 1);
    CHECK(health.active_count == 1);
    moe_ep_destroy(&h);
  });
}

namespace {

// A backend without masks whose host-mapped state says a kernel timed out
// waiting for rank 1: what the NVLINK_TWO_SIDED backend's timeout mirror shows.
class MirrorBackend final : public CountingBackend {
 public:
  MirrorBackend() : CountingBackend("mirror stand-in") {}
  moe_ep::HostHealth host_health() const override {
    moe_ep::HostHealth h;
    if (timed_out) {
      h.status = MOE_EP_ERROR_TIMEOUT;
      h.failed_rank = 1;
      h.message = "dispatch: rank 1 did not arrive within timeout_ms";
    }
    return h;
  }
  bool timed_out = false;
};

}  // namespace

TEST_CASE("active ranks: a backend without masks takes only all-active; the poll reads its host state", "[mask]") {
  moe_ep_handle_s h;
  h.config = host_config();
  h.layout = moe_ep::make_layout(small_workload(2, 1).params(), 2, 0);
  auto owned = std::make_unique<MirrorBackend>();
  MirrorBackend* backend = owned.get();
  h.backend = std::move(owned);
  h.slots.resize(1);
  h.active.assign(2, 1);
  const uint8_t one[2] = {1, 0}, both[2] = {1, 1};
  CHECK(moe_ep_set_active_ranks(&h, one, 2) == MOE_EP_ERROR_UNSUPPORTED);
  CHECK_THAT(moe_ep_last_error(), Contains("mirror stand-in") && Contains("rank 1 inactive"));
  CHECK(moe_ep_set_active_ranks(&h, both, 2) == MOE_EP_SUCCESS);
  moe_ep_health_t health = poll_health(&h);
  CHECK(health.status == MOE_EP_SUCCESS);
  CHECK(health.mask_epoch == 1);
  CHECK(health.active_count == 2);
  backend->timed_out = true;  // the device watch wrote the host-mapped word
  health = poll_health(&h);
  CHECK(health.status == MOE_EP_ERROR_TIMEOUT);
  CHECK(health.failed_rank == 1);
  CHECK_THAT(moe_ep_last_error(), Contains("rank 1 did not arrive"));
  backend->timed_out = false;  // sticky: the handle keeps it
  CHECK(poll_health(&h).status == MOE_EP_ERROR_TIMEOUT);
  const WorkloadSpec w = small_workload(2, 1);
  RankPair pair(w, 0);
  moe_ep_dispatch_result_t r;
  moe_ep_dispatch_result_init(&r, sizeof r);
  CHECK(moe_ep_dispatch(&h, pair.args.get(), &r, nullptr) == MOE_EP_ERROR_TIMEOUT);
  CHECK(backend->calls == 0);
  h.backend.reset();
}
