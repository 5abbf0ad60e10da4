// Split phases and two micro-batches in flight (docs/overlap.md): the halves
// against the fused calls (bitwise) and the oracle, every interleaving of two
// micro-batches, every misuse of the per-slot state machine, a timeout in each
// half that waits, and the UNSUPPORTED answer of a backend without halves.
// HOST backend, ranks as threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "counting_backend.hpp"
#include "handle.hpp"
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

// Bitwise equality of two float vectors (NaNs included); memcmp takes no NULL,
// which an empty vector's data() may be.
bool same_float_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

WorkloadSpec small_spec(int world, uint64_t seed) {
  WorkloadSpec w = small_workload(world, seed);
  w.max_tokens_per_rank = 7;
  w.hidden_size = 20;
  return w;
}

moe_ep_handle_t create(const moe_ep_bootstrap_t& b, const WorkloadSpec& w, int32_t micro_batches,
                       int32_t timeout_ms = 30000) {
  moe_ep_params_t p = w.params();
  moe_ep_config_t c = host_config();
  c.micro_batches = micro_batches;
  c.timeout_ms = timeout_ms;
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) return nullptr;
  return h;
}

// One rank's micro-batch: its inputs, and the checks of each half's results.
struct MicroBatch : RankPair {
  std::vector<uint8_t> output;
  TensorView out;
  moe_ep_dispatch_result_t result{};  // the views dispatch_recv returned (`received` holds what they read)

  MicroBatch(const WorkloadSpec& spec, int r)
      : RankPair(spec, r),
        output(size_t(tokens()) * w.combine_row_bytes(), 0xFF),
        out(combine_output_view(w, output.data(), tokens(), host_device())) {}

  void check_dispatch_result(const moe_ep_dispatch_result_t& r) {
    RankPair::check_dispatch_result(r);
    // The next dispatch on this slot must rewrite them.
    if (r.hidden_states.data) std::memset(r.hidden_states.data, 0xA5, size_t(w.receive_rows() * w.hidden_row_bytes()));
  }

  // The four halves on `slot`; the caller's output tensor on odd seeds, library memory on even.
  void dispatch_send(moe_ep_handle_t h, int32_t slot) {
    ok(moe_ep_dispatch_send(h, slot, args.get(), nullptr), "moe_ep_dispatch_send");
    // The inputs are free once the send half returns (HOST): spoil them.
    std::fill(in.hidden.begin(), in.hidden.end(), uint8_t{0x5A});
  }
  void dispatch_recv(moe_ep_handle_t h, int32_t slot) {
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    if (ok(moe_ep_dispatch_recv(h, slot, &r, nullptr), "moe_ep_dispatch_recv")) {
      result = r;
      check_dispatch_result(r);
    }
  }
  // The results are still those of dispatch_recv (ids, weights, counts: the payload was poisoned).
  bool results_unchanged() {
    Verdict v;
    const ReceivedDispatch again = read_dispatch(w, result, host_device(), read_host_memory, v);
    return v.wrong == 0 && again.topk_ids == received.topk_ids && again.recv_counts == received.recv_counts &&
           again.local_expert_counts == received.local_expert_counts &&
           same_float_bits(again.topk_weights, received.topk_weights);
  }
  void combine_send(moe_ep_handle_t h, int32_t slot) {
    // The dispatch results stay valid until combine_send, whatever the other slot did meanwhile.
    if (problems.empty() && !results_unchanged()) problems = "dispatch results changed before combine_send";
    ok(moe_ep_combine_send(h, slot, eo.get(), nullptr), "moe_ep_combine_send");
    // The expert output is free once the send half returns (HOST): spoil it.
    std::fill(expert_output.begin(), expert_output.end(), uint8_t{0x7F});
  }
  void combine_recv(moe_ep_handle_t h, int32_t slot) {
    moe_ep_combine_result_t r;
    moe_ep_combine_result_init(&r, sizeof r);
    const bool caller_output = w.seed % 2 == 1;
    if (ok(moe_ep_combine_recv(h, slot, caller_output ? out.get() : nullptr, &r, nullptr), "moe_ep_combine_recv")) {
      check_combine_result(r);
    }
  }
  void step(moe_ep_handle_t h, int32_t slot, int half) {
    switch (half) {
      case 0: dispatch_send(h, slot); break;
      case 1: dispatch_recv(h, slot); break;
      case 2: combine_send(h, slot); break;
      default: combine_recv(h, slot);
    }
  }
};

std::string status_and_message(moe_ep_status_t s) {
  return std::string(moe_ep_status_string(s)) + ": " + moe_ep_last_error();
}

// Host copies of one round's results through the fused calls or the halves.
struct RoundResults {
  ReceivedDispatch received;
  std::vector<uint8_t> combined;
  std::string problems;
};

RoundResults run_round(moe_ep_handle_t h, const WorkloadSpec& w, int rank, bool split) {
  MicroBatch mb(w, rank);
  if (split) {
    for (int half = 0; half < 4 && mb.problems.empty(); ++half) mb.step(h, 0, half);
  } else {
    moe_ep_dispatch_result_t dr;
    moe_ep_dispatch_result_init(&dr, sizeof dr);
    if (mb.ok(moe_ep_dispatch(h, mb.args.get(), &dr, nullptr), "moe_ep_dispatch")) {
      mb.check_dispatch_result(dr);
      moe_ep_combine_result_t cr;
      moe_ep_combine_result_init(&cr, sizeof cr);
      if (mb.ok(moe_ep_combine(h, mb.eo.get(), w.seed % 2 ? mb.out.get() : nullptr, &cr, nullptr), "moe_ep_combine")) {
        mb.check_combine_result(cr);
      }
    }
  }
  return RoundResults{mb.received, mb.combined, mb.problems};
}

bool same_bits(const ReceivedDispatch& a, const ReceivedDispatch& b) {
  return a.tokens_per_rank == b.tokens_per_rank && a.hidden == b.hidden && a.scales == b.scales &&
         a.topk_ids == b.topk_ids && same_float_bits(a.topk_weights, b.topk_weights) &&
         a.recv_counts == b.recv_counts && a.local_expert_counts == b.local_expert_counts &&
         a.eplb_gathered == b.eplb_gathered;
}

}  // namespace

TEST_CASE("split phases: the halves give the fused calls' bits and the oracle's values", "[split]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<WorkloadSpec> specs;
  for (int world : {1, 2, 3}) specs.push_back(small_spec(world, seed + world));
  WorkloadSpec scaled = small_spec(2, seed ^ 0x51);
  scaled.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
  scaled.scale_row_elems = 3;
  scaled.eplb_stats = true;
  scaled.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};
  scaled.routing.mask_fraction = 0.2;
  specs.push_back(scaled);
  WorkloadSpec runtime = small_spec(3, seed ^ 0x77);
  runtime.runtime_max_tokens_per_rank = 4;
  runtime.weights = false;
  runtime.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 16, 1};
  specs.push_back(runtime);
  WorkloadSpec wide = small_spec(2, seed ^ 0x99);
  wide.top_k = 8;
  wide.num_experts = 8;
  wide.hidden_size = 67;
  wide.routing.kind = RoutingKind::zipf;
  specs.push_back(wide);

  for (const WorkloadSpec& spec : specs) {
    INFO(spec.describe());
    std::vector<std::string> problems(spec.world);
    RankChecks checks;
    run_ranks(spec.world, [&](int rank, const moe_ep_bootstrap_t& b) {
      moe_ep_handle_t fused = create(b, spec, 1);
      RANK_REQUIRE(checks, rank, fused != nullptr);
      moe_ep_handle_t split = create(b, spec, 2);
      RANK_REQUIRE(checks, rank, split != nullptr);
      for (int round = 0; round < 3; ++round) {
        WorkloadSpec w = spec;
        w.seed = spec.seed * 31 + round;
        const RoundResults a = run_round(fused, w, rank, false);
        const RoundResults c = run_round(split, w, rank, true);
        RANK_CHECK(checks, rank, a.problems == "");
        RANK_CHECK(checks, rank, c.problems == "");
        RANK_CHECK(checks, rank, same_bits(a.received, c.received));
        RANK_CHECK(checks, rank, a.combined == c.combined);
        if (!a.problems.empty() || !c.problems.empty()) problems[rank] = a.problems + c.problems;
      }
      RANK_CHECK(checks, rank, moe_ep_destroy(&fused) == MOE_EP_SUCCESS);
      RANK_CHECK(checks, rank, moe_ep_destroy(&split) == MOE_EP_SUCCESS);
    });
    for (const std::string& p : problems) INFO(p);
    checks.assert_all();
  }
}

TEST_CASE("split phases: every interleaving of two micro-batches matches the oracle", "[split]") {
  // Each micro-batch issues its four halves in order; every merge of the two
  // sequences (70 of them) is valid with two slots.  Both slot assignments.
  std::vector<std::vector<int>> orders;  // 0 = A's next half, 1 = B's
  std::vector<int> order = {0, 0, 0, 0, 1, 1, 1, 1};
  do orders.push_back(order);
  while (std::next_permutation(order.begin(), order.end()));
  REQUIRE(orders.size() == 70);

  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const int world = 2;
  std::vector<std::string> problems(world);
  RankChecks checks;
  run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, small_spec(world, seed), 2);
    RANK_REQUIRE(checks, rank, h != nullptr);
    for (size_t i = 0; i < orders.size() * 2; ++i) {
      const std::vector<int>& o = orders[i % orders.size()];
      const int32_t slot_a = i < orders.size() ? 0 : 1;
      MicroBatch a(small_spec(world, seed * 1000 + 2 * i), rank);
      MicroBatch bb(small_spec(world, seed * 1000 + 2 * i + 1), rank);
      int next[2] = {0, 0};
      for (int who : o) {
        MicroBatch& mb = who == 0 ? a : bb;
        mb.step(h, who == 0 ? slot_a : 1 - slot_a, next[who]++);
      }
      RANK_CHECK(checks, rank, a.problems == "");
      RANK_CHECK(checks, rank, bb.problems == "");
      if (!a.problems.empty() || !bb.problems.empty()) {
        problems[rank] = "interleaving " + std::to_string(i) + ": " + a.problems + " | " + bb.problems;
        break;
      }
    }
    // The fused calls still work on slot 0 between split pairs, and while slot 1's pair is in flight.
    RoundResults fused = run_round(h, small_spec(world, seed + 5), rank, false);
    RANK_CHECK(checks, rank, fused.problems == "");
    MicroBatch held(small_spec(world, seed + 6), rank);
    held.dispatch_send(h, 1);
    held.dispatch_recv(h, 1);
    fused = run_round(h, small_spec(world, seed + 7), rank, false);
    RANK_CHECK(checks, rank, fused.problems == "");
    RANK_CHECK(checks, rank, held.results_unchanged());  // slot 1's results survive slot 0's pair
    held.combine_send(h, 1);
    held.combine_recv(h, 1);
    RANK_CHECK(checks, rank, held.problems == "");
    RANK_CHECK(checks, rank, moe_ep_destroy(&h) == MOE_EP_SUCCESS);
  });
  for (const std::string& p : problems) INFO(p);
  checks.assert_all();
}

TEST_CASE("split phases: misuse is INVALID_STATE naming both states, and the handle stays usable", "[split]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const int world = 2;
  struct Seen {
    moe_ep_status_t status;
    std::string message;
  };
  // Per rank, the answers in the order of the script below.
  std::vector<std::vector<Seen>> seen(world);
  std::vector<std::string> problems(world);
  RankChecks checks;
  run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
    const WorkloadSpec w = small_spec(world, seed);
    moe_ep_handle_t h = create(b, w, 2);
    RANK_REQUIRE(checks, rank, h != nullptr);
    MicroBatch a(w, rank), c(small_spec(world, seed + 1), rank);
    moe_ep_dispatch_result_t dr;
    moe_ep_dispatch_result_init(&dr, sizeof dr);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    const auto note = [&](moe_ep_status_t s) { seen[rank].push_back(Seen{s, moe_ep_last_error()}); };

    note(moe_ep_dispatch_recv(h, 0, &dr, nullptr));          // 0: receive without its send
    note(moe_ep_combine_send(h, 0, a.eo.get(), nullptr));    // 1: combine without a dispatch
    note(moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr));  // 2: combine receive without anything
    a.dispatch_send(h, 0);
    note(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr));  // 3: a second send on the slot
    note(moe_ep_combine_send(h, 0, a.eo.get(), nullptr));     // 4: combine before the dispatch's receive
    note(moe_ep_dispatch(h, a.args.get(), &dr, nullptr));     // 5: fused dispatch on a busy slot 0
    a.dispatch_recv(h, 0);
    note(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr));  // 6: reuse of a slot whose results are live
    note(moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr));   // 7: combine receive without its send
    c.dispatch_send(h, 1);
    c.dispatch_recv(h, 1);
    note(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr));  // 8: a third pair: both slots in flight
    note(moe_ep_dispatch_send(h, 2, a.args.get(), nullptr));  // 9: a third pair on a slot that does not exist
    a.combine_send(h, 0);
    note(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr));     // 10: a send on a slot whose combine is in flight
    note(moe_ep_combine(h, a.eo.get(), nullptr, &cr, nullptr));  // 11: fused combine on COMBINE_SENT
    a.combine_recv(h, 0);
    c.combine_send(h, 1);
    c.combine_recv(h, 1);
    note(moe_ep_combine_send(h, -1, a.eo.get(), nullptr));  // 12: a negative slot
    RANK_CHECK(checks, rank, a.problems == "");
    RANK_CHECK(checks, rank, c.problems == "");
    // Still usable and in step: a full round on each slot, and the fused calls.
    MicroBatch d(small_spec(world, seed + 2), rank), e(small_spec(world, seed + 3), rank);
    for (int half = 0; half < 4; ++half) {
      d.step(h, 1, half);
      e.step(h, 0, half);
    }
    RANK_CHECK(checks, rank, d.problems == "");
    RANK_CHECK(checks, rank, e.problems == "");
    RANK_CHECK(checks, rank, run_round(h, small_spec(world, seed + 4), rank, false).problems == "");
    moe_ep_status_t async = MOE_EP_ERROR_INTERNAL;
    RANK_CHECK(checks, rank, moe_ep_get_async_error(h, &async) == MOE_EP_SUCCESS && async == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, moe_ep_destroy(&h) == MOE_EP_SUCCESS);
    if (!a.problems.empty() || !c.problems.empty()) problems[rank] = a.problems + c.problems;
  });
  for (const std::string& p : problems) INFO(p);
  checks.assert_all();

  struct Expect {
    moe_ep_status_t status;
    std::vector<std::string> words;
  };
  const std::vector<Expect> expected = {
      {MOE_EP_ERROR_INVALID_STATE,
       {"moe_ep_dispatch_recv(slot 0)", "expected slot 0 in state DISPATCH_SENT", "got IDLE"}},
      {MOE_EP_ERROR_INVALID_STATE,
       {"moe_ep_combine_send(slot 0)", "DISPATCHED", "got IDLE", "expected a dispatch first"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_combine_recv(slot 0)", "COMBINE_SENT", "got IDLE"}},
      {MOE_EP_ERROR_INVALID_STATE,
       {"moe_ep_dispatch_send(slot 0)", "expected slot 0 in state IDLE", "got DISPATCH_SENT"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_combine_send(slot 0)", "got DISPATCH_SENT", "moe_ep_dispatch_recv"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_dispatch(slot 0)", "got DISPATCH_SENT"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_dispatch_send(slot 0)", "got DISPATCHED", "results are live"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_combine_recv(slot 0)", "got DISPATCHED", "moe_ep_combine_send"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_dispatch_send(slot 0)", "got DISPATCHED", "2 pairs in flight"}},
      {MOE_EP_ERROR_INVALID_ARGUMENT, {"moe_ep_dispatch_send: slot", "[0, 2)", "micro_batches = 2", "got 2"}},
      {MOE_EP_ERROR_INVALID_STATE, {"moe_ep_dispatch_send(slot 0)", "got COMBINE_SENT", "moe_ep_combine_recv"}},
      {MOE_EP_ERROR_INVALID_STATE,
       {"moe_ep_combine(slot 0)", "expected slot 0 in state DISPATCHED", "got COMBINE_SENT"}},
      {MOE_EP_ERROR_INVALID_ARGUMENT, {"moe_ep_combine_send: slot", "got -1"}},
  };
  for (int rank = 0; rank < world; ++rank) {
    REQUIRE(seen[rank].size() == expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      INFO("rank " << rank << ", misuse " << i << ": " << seen[rank][i].message);
      CHECK(seen[rank][i].status == expected[i].status);
      for (const std::string& word : expected[i].words) CHECK_THAT(seen[rank][i].message, Contains(word));
      if (expected[i].status == MOE_EP_ERROR_INVALID_STATE) {
        CHECK_THAT(seen[rank][i].message, Contains("nothing was done, the handle stays usable"));
      }
    }
  }
}

TEST_CASE("split phases: micro_batches is checked, counted by moe_ep_workspace_size, 1 slot by default", "[split]") {
  const WorkloadSpec w = small_spec(2, 1);
  const moe_ep_params_t p = w.params();
  moe_ep_config_t c = host_config();
  uint64_t one = 0, two = 0, zero = 0;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &one) == MOE_EP_SUCCESS);
  c.micro_batches = 2;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &two) == MOE_EP_SUCCESS);
  c.micro_batches = 0;  // read as 1
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &zero) == MOE_EP_SUCCESS);
  CHECK(one > 0);
  CHECK(two == 2 * one);
  CHECK(zero == one);
  for (int32_t bad : {3, -1}) {
    c.micro_batches = bad;
    uint64_t bytes = 0;
    CHECK(moe_ep_workspace_size(&p, &c, 2, &bytes) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(moe_ep_last_error(), Contains("config->micro_batches") && Contains("got " + std::to_string(bad)));
  }

  // A default handle has one slot: slot 1 is an argument error; slot 0 splits.
  std::vector<moe_ep_status_t> slot1(1);
  std::string message, problems;
  run_ranks(1, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, small_spec(1, 9), 1);
    if (h == nullptr) return;
    MicroBatch mb(small_spec(1, 9), rank);
    slot1[0] = moe_ep_dispatch_send(h, 1, mb.args.get(), nullptr);
    message = moe_ep_last_error();
    for (int half = 0; half < 4; ++half) mb.step(h, 0, half);
    problems = mb.problems;
    moe_ep_destroy(&h);
  });
  CHECK(slot1[0] == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(message, Contains("[0, 1)") && Contains("micro_batches = 1"));
  CHECK(problems == "");

  // Every rank must agree on it.
  const CreateOutcomes created = create_on_ranks(2, [&](int rank, moe_ep_params_t& params, moe_ep_config_t& config) {
    params = w.params();
    config.micro_batches = rank == 0 ? 1 : 2;
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO(created.messages[rank]);
    CHECK(created.status[rank] != MOE_EP_SUCCESS);
    CHECK_THAT(created.messages[rank], Contains("config->micro_batches"));
  }
}

namespace {

// Rank 0 waits in `half` (0 dispatch_send, 1 dispatch_recv, 3 combine_recv)
// while rank 1 stops just before it.  Returns rank 0's status, message and wait.
struct TimedOut {
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
  double waited_ms = 0;
  moe_ep_status_t combine_send = MOE_EP_SUCCESS;  // rank 0's combine_send, when rank 1 skipped its own
  moe_ep_status_t later = MOE_EP_SUCCESS;         // a later call on rank 0's handle
};

TimedOut time_out_in(int half, int32_t timeout_ms) {
  TimedOut got;
  RankChecks checks;
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    const WorkloadSpec w = small_spec(2, 42);
    moe_ep_handle_t h = create(b, w, 2, timeout_ms);
    RANK_REQUIRE(checks, rank, h != nullptr);
    MicroBatch mb(w, rank);
    const int stop = rank == 1 ? (half == 3 ? 2 : half) : 4;  // rank 1 never issues `half` (nor combine_send for 3)
    for (int i = 0; i < stop; ++i) {
      if (rank == 0 && i == half) {
        moe_ep_dispatch_result_t dr;
        moe_ep_dispatch_result_init(&dr, sizeof dr);
        moe_ep_combine_result_t cr;
        moe_ep_combine_result_init(&cr, sizeof cr);
        const auto start = std::chrono::steady_clock::now();
        got.status = half == 0   ? moe_ep_dispatch_send(h, 0, mb.args.get(), nullptr)
                     : half == 1 ? moe_ep_dispatch_recv(h, 0, &dr, nullptr)
                                 : moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr);
        got.waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        got.message = moe_ep_last_error();
        got.later = moe_ep_dispatch_send(h, 1, mb.args.get(), nullptr);
        break;
      }
      mb.step(h, 0, i);
      if (rank == 0 && i == 2) got.combine_send = mb.problems.empty() ? MOE_EP_SUCCESS : MOE_EP_ERROR_INTERNAL;
      RANK_CHECK(checks, rank, mb.problems == "");
    }
    moe_ep_destroy(&h);
  });
  checks.assert_all();
  return got;
}

}  // namespace

TEST_CASE("split phases: a peer that never sends makes the waiting half TIMEOUT within timeout_ms", "[split]") {
  constexpr int32_t kTimeoutMs = 300;
  const struct {
    int half;
    const char* step;
  } cases[] = {{0, "HOST dispatch: headers"}, {1, "HOST dispatch: token records"}, {3, "HOST combine: expert outputs"}};
  for (const auto& c : cases) {
    INFO("half " << c.half);
    const TimedOut got = time_out_in(c.half, kTimeoutMs);
    INFO(got.message);
    CHECK(got.status == MOE_EP_ERROR_TIMEOUT);
    CHECK_THAT(got.message, Contains(c.step) && Contains("timeout_ms = 300"));
    CHECK(got.waited_ms >= kTimeoutMs * 0.9);
    CHECK(got.waited_ms < kTimeoutMs + 2000);
    CHECK(got.later == MOE_EP_ERROR_TIMEOUT);  // sticky: the handle is unusable
    // combine_send waits for no peer: it succeeded although rank 1 never issued its own.
    if (c.half == 3) CHECK(got.combine_send == MOE_EP_SUCCESS);
  }
}

TEST_CASE("split phases: a backend without halves answers UNSUPPORTED and launches nothing", "[split]") {
  for (int32_t backend : {MOE_EP_BACKEND_NVLINK_TWO_SIDED, MOE_EP_BACKEND_NCCL}) {
    const char* name = backend == MOE_EP_BACKEND_NCCL ? "NCCL" : "NVLINK_TWO_SIDED";
    INFO(name);
    moe_ep_handle_s h;
    h.config = host_config();
    h.config.backend = backend;
    h.layout = moe_ep::make_layout(small_spec(1, 1).params(), 1, 0);
    // A backend with only the fused calls, for the handle's refusal of the halves.
    auto owned = std::make_unique<CountingBackend>("fused-only");
    CountingBackend* fused = owned.get();
    h.backend = std::move(owned);
    h.slots.resize(1);
    MicroBatch mb(small_spec(1, 1), 0);
    moe_ep_dispatch_result_t dr;
    moe_ep_dispatch_result_init(&dr, sizeof dr);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    CHECK(moe_ep_dispatch_send(&h, 0, mb.args.get(), nullptr) == MOE_EP_ERROR_UNSUPPORTED);
    CHECK_THAT(moe_ep_last_error(), Contains(std::string("moe_ep_dispatch_send: the ") + name +
                                             " backend has no split phases; use moe_ep_dispatch"));
    CHECK(moe_ep_dispatch_recv(&h, 0, &dr, nullptr) == MOE_EP_ERROR_UNSUPPORTED);
    CHECK_THAT(moe_ep_last_error(), Contains("moe_ep_dispatch_recv: the") && Contains(name));
    CHECK(moe_ep_combine_send(&h, 0, mb.eo.get(), nullptr) == MOE_EP_ERROR_UNSUPPORTED);
    CHECK_THAT(moe_ep_last_error(), Contains("use moe_ep_combine"));
    CHECK(moe_ep_combine_recv(&h, 0, nullptr, &cr, nullptr) == MOE_EP_ERROR_UNSUPPORTED);
    CHECK(fused->calls == 0);
    CHECK(h.slots[0].state == moe_ep::SlotState::idle);
    h.backend.reset();
  }
}

TEST_CASE("split phases: a receive half refused by the peer checks ends its pair, on every rank", "[split]") {
  // Every rank receives rank 1's dispatch record with a wrong stamp (the first
  // exchange after create that is not a header): dispatch_recv is INVALID_INPUT
  // on every rank, the slot is IDLE again, and the next pair on it works.
  constexpr size_t kHeaderBytes = 32;
  auto armed = std::make_shared<std::vector<int>>(2, 0);  // per rank: 1 once create returned
  auto done = std::make_shared<std::vector<int>>(2, 0);
  auto m = std::make_shared<std::mutex>();
  const Tamper tamper = [=](int rank, int64_t, void* recv, size_t bytes) {
    std::lock_guard<std::mutex> lock(*m);
    if (bytes == kHeaderBytes || !(*armed)[rank]) return;
    if ((*done)[rank]++ != 0) return;
    static_cast<unsigned char*>(recv)[bytes] ^= 0x40;  // rank 1's stamp: its dispatch sequence
  };
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<moe_ep_status_t> refused(2, MOE_EP_SUCCESS);
  std::vector<std::string> messages(2), problems(2);
  RankChecks checks;
  run_ranks(
      2,
      [&](int rank, const moe_ep_bootstrap_t& b) {
        moe_ep_handle_t h = create(b, small_spec(2, seed), 2, 5000);
        RANK_REQUIRE(checks, rank, h != nullptr);
        {
          std::lock_guard<std::mutex> lock(*m);
          (*armed)[rank] = 1;
        }
        MicroBatch a(small_spec(2, seed), rank), c(small_spec(2, seed + 1), rank);
        a.dispatch_send(h, 0);
        moe_ep_dispatch_result_t dr;
        moe_ep_dispatch_result_init(&dr, sizeof dr);
        refused[rank] = moe_ep_dispatch_recv(h, 0, &dr, nullptr);
        messages[rank] = moe_ep_last_error();
        for (int half = 0; half < 4; ++half) c.step(h, 0, half);  // the slot is free again
        problems[rank] = a.problems + c.problems;
        moe_ep_status_t async = MOE_EP_SUCCESS;
        RANK_CHECK(checks, rank, moe_ep_get_async_error(h, &async) == MOE_EP_SUCCESS);
        RANK_CHECK(checks, rank, moe_ep_destroy(&h) == MOE_EP_SUCCESS);
      },
      tamper);
  checks.assert_all();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << messages[rank] << " / " << problems[rank]);
    CHECK(refused[rank] == MOE_EP_ERROR_INVALID_INPUT);
    CHECK_THAT(messages[rank], Contains("rank 1's record") && Contains("does not match its header"));
    CHECK(problems[rank] == "");
  }
}
