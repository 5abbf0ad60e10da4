// The split phases' host side of the NVLink backend, without a GPU: the
// watchdog's stall detector (src/nvlink/receive_watchdog.hpp), which decides
// when a receive half's stream wait has lasted timeout_ms, and the buffer
// slots' workspace offsets (src/nvlink/workspace_plan.hpp).
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

#include "moe_ep_kernels.h"
#include "nvlink/receive_watchdog.hpp"
#include "nvlink/workspace_plan.hpp"
#include "params.hpp"

using moe_ep::ReceiveStallDetector;
using moe_ep::kernels::HostTimeoutMirror;
using std::chrono::milliseconds;

namespace {

using Clock = std::chrono::steady_clock;
const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

}  // namespace

TEST_CASE("stall detector: a wait with no receive completing is released after timeout_ms, once", "[watchdog]") {
  ReceiveStallDetector d(2, milliseconds(100));
  HostTimeoutMirror m{};  // nothing waiting, nothing completed
  CHECK(d.look(m, t0).empty());
  m.watch[1].waiting = 1;
  CHECK(d.look(m, t0).empty());  // the clock starts at the first look that sees it
  CHECK(d.look(m, t0 + milliseconds(99)).empty());
  CHECK(d.look(m, t0 + milliseconds(100)) == std::vector<int32_t>{1});
  CHECK(d.look(m, t0 + milliseconds(500)).empty());  // reported once per stall
  // The released receive then finishes: a new stall is reported again.
  m.watch[1].completed = 1;
  CHECK(d.look(m, t0 + milliseconds(600)).empty());
  CHECK(d.look(m, t0 + milliseconds(700)) == std::vector<int32_t>{1});
}

TEST_CASE("stall detector: receives that keep completing, or idle slots, are never released", "[watchdog]") {
  ReceiveStallDetector d(2, milliseconds(100));
  HostTimeoutMirror m{};  // nothing waiting, nothing completed
  // Slot 0 is found waiting at every look, but a receive completes between
  // looks: a busy stream, not a stuck one.
  m.watch[0].waiting = 1;
  for (int i = 0; i < 50; ++i) {
    m.watch[0].completed = static_cast<uint32_t>(i);
    CHECK(d.look(m, t0 + milliseconds(60) * i).empty());
  }
  // Then both slots idle (not waiting) for a long time.
  m.watch[0].waiting = 0;
  CHECK(d.look(m, t0 + std::chrono::hours(2)).empty());
  CHECK(d.look(m, t0 + std::chrono::hours(3)).empty());
  // A wait that ended (waiting cleared) restarts the clock of the next one.
  m.watch[0].waiting = 1;
  CHECK(d.look(m, t0 + std::chrono::hours(3) + milliseconds(1)).empty());
  CHECK(d.look(m, t0 + std::chrono::hours(3) + milliseconds(99)).empty());
  CHECK(d.look(m, t0 + std::chrono::hours(3) + milliseconds(101)) == std::vector<int32_t>{0});
}

TEST_CASE("stall detector: slots are judged apart; the slot count is clamped to the mirror's", "[watchdog]") {
  ReceiveStallDetector d(5, milliseconds(10));  // more slots than the mirror has: clamped to kMaxSlots
  HostTimeoutMirror m{};                        // nothing waiting, nothing completed
  m.watch[0].waiting = 1;
  m.watch[1].waiting = 1;
  CHECK(d.look(m, t0).empty());
  m.watch[1].completed = 7;  // slot 1 progressed
  const std::vector<int32_t> released = d.look(m, t0 + milliseconds(10));
  CHECK(released == std::vector<int32_t>{0});
}

TEST_CASE("watchdog period: a look every timeout_ms / 8, between 1 and 100 ms", "[watchdog]") {
  CHECK(moe_ep::ReceiveWatchdog::period(1) == milliseconds(1));
  CHECK(moe_ep::ReceiveWatchdog::period(400) == milliseconds(50));
  CHECK(moe_ep::ReceiveWatchdog::period(30000) == milliseconds(100));
}

TEST_CASE("buffer slots: each slot is slot 0's layout moved by whole slots", "[slots]") {
  moe_ep_params_t params;
  moe_ep_params_init(&params, sizeof params);
  params.num_experts = 16;
  params.top_k = 4;
  params.max_tokens_per_rank = 33;
  params.hidden_size = 100;
  const moe_ep::Layout layout = moe_ep::make_layout(params, 2, 1);
  const moe_ep::kernels::WorkspaceOffsets first = moe_ep::plan_workspace(layout);
  REQUIRE(first.total_bytes % 256 == 0);
  const moe_ep::kernels::WorkspaceOffsets second = moe_ep::slot_offsets(first, 1);
  CHECK(second.dispatch_arrivals == first.total_bytes);
  CHECK(second.dispatch_ready == first.dispatch_ready + first.total_bytes);
  CHECK(second.combine_ready == first.combine_ready + first.total_bytes);
  CHECK(second.control == first.control + first.total_bytes);
  CHECK(second.combine_out == first.combine_out + first.total_bytes);
  CHECK(second.total_bytes == 2 * first.total_bytes);
  CHECK(moe_ep::slot_offsets(first, 0).recv_hidden == first.recv_hidden);
  CHECK(moe_ep::slots_total_bytes(first, 2) == 2 * first.total_bytes);
  CHECK(moe_ep::slots_total_bytes(first, 1) == first.total_bytes);
  // The ready words are shared regions of their own, before the private part.
  CHECK(first.dispatch_ready < first.peer_bases);
  CHECK(first.combine_ready < first.peer_bases);
  CHECK(first.dispatch_ready != first.combine_ready);
}
