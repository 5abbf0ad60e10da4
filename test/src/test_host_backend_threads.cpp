// The HOST backend with 1 to 4 ranks run as threads, against the oracle of
// moe_ep_verify, on fresh random inputs for every case and round.
#include <catch2/catch.hpp>

#include <mutex>
#include <string>
#include <vector>

#include "host_case_runner.hpp"
#include "small_workload.hpp"
#include "thread_bootstrap.hpp"

using namespace moe_ep_test;

namespace {

// Runs the case on spec.world thread-ranks and checks every rank.
void run_and_check(const WorkloadSpec& spec, int rounds = 2) {
  std::vector<std::string> problems(spec.world);
  run_ranks(spec.world,
            [&](int rank, const moe_ep_bootstrap_t& b) { problems[rank] = run_host_case(spec, b, rounds).problems; });
  for (int r = 0; r < spec.world; ++r) {
    INFO(spec.describe() << "\nrank " << r << ":\n" << problems[r]);
    CHECK(problems[r].empty());
  }
}

}  // namespace

TEST_CASE("host backend: random routing, 1 to 4 ranks", "[host]") {
  for (int world = 1; world <= 4; ++world) {
    for (uint64_t seed = 1; seed <= 3; ++seed) run_and_check(small_workload(world, seed * 100 + world));
  }
}

TEST_CASE("host backend: masked picks, zero and unequal token counts, runtime max", "[host]") {
  WorkloadSpec s = small_workload(3, 7);
  s.routing.mask_fraction = 0.4;
  s.tokens = {0, 9, 4};
  run_and_check(s);
  s.tokens = {0, 0, 0};
  run_and_check(s);
  s.tokens = {};
  s.runtime_max_tokens_per_rank = 5;
  run_and_check(s);
  s.routing.mask_fraction = 1.0;  // every pick masked: nothing moves, combine writes zeros
  s.tokens = {5, 5, 5};
  run_and_check(s);
}

TEST_CASE("host backend: dtypes, scales, payload sizes, weights and EPLB", "[host]") {
  WorkloadSpec s = small_workload(2, 11);
  SECTION("fp16 combine, no weights") {
    s.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 16, 1};
    s.weights = false;
    run_and_check(s);
  }
  SECTION("fp32 combine, odd hidden size") {
    s.combine_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};
    s.hidden_size = 13;
    run_and_check(s);
  }
  SECTION("fp8 payload with fp32 scales") {
    s.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
    s.hidden_size = 100;
    s.scale_row_elems = 1;
    run_and_check(s);
  }
  SECTION("packed fp4 payload (odd element count) with fp8 scales") {
    s.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT4_E2M1FN, 4, 1};
    s.hidden_row_elems = 33;
    s.scale_row_elems = 3;
    s.scale_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
    run_and_check(s);
  }
  SECTION("EPLB stats counted from topk_ids") {
    s.eplb_stats = true;
    s.routing.mask_fraction = 0.2;
    run_and_check(s);
  }
  SECTION("EPLB stats passed in") {
    s.eplb_stats = true;
    s.eplb_given = true;
    run_and_check(s);
  }
  SECTION("invalid id = num_experts") {
    s.invalid_expert_id = s.num_experts;
    s.routing.mask_fraction = 0.3;
    run_and_check(s);
  }
}

TEST_CASE("host backend: expert counts and top_k extremes", "[host]") {
  WorkloadSpec s = small_workload(2, 21);
  SECTION("6 experts on 2 ranks, top_k 6") {
    s.num_experts = 6;
    s.top_k = 6;
    run_and_check(s);
  }
  SECTION("top_k 1") {
    s.top_k = 1;
    run_and_check(s);
  }
  SECTION("top_k 32 of 64 experts, 4 ranks") {
    s.world = 4;
    s.num_experts = 64;
    s.top_k = 32;
    run_and_check(s);
  }
}

TEST_CASE("host backend: repeated rounds on one handle and bitwise reproducibility", "[host]") {
  WorkloadSpec s = small_workload(3, 31);
  run_and_check(s, 4);  // buffers reused across rounds, fresh inputs each round
  std::vector<std::vector<uint8_t>> first(3), second(3);
  run_ranks(3, [&](int rank, const moe_ep_bootstrap_t& b) { first[rank] = run_host_case(s, b, 3).combined; });
  run_ranks(3, [&](int rank, const moe_ep_bootstrap_t& b) { second[rank] = run_host_case(s, b, 3).combined; });
  CHECK(first == second);
}

TEST_CASE("host backend: two handles on the same group coexist", "[host]") {
  std::vector<std::string> problems(2);
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    WorkloadSpec a = small_workload(2, 41), c = small_workload(2, 42);
    c.hidden_size = 8;
    c.top_k = 1;
    // Two handles alive at once, used alternately.
    const CaseOutcome first = run_host_case(a, b);
    const CaseOutcome second = run_host_case(c, b);
    problems[rank] = first.problems + second.problems;
  });
  CHECK(problems[0].empty());
  CHECK(problems[1].empty());
}
