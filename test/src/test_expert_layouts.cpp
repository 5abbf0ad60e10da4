// The expert receive layouts (docs/semantics.md, "Receive layouts") on the
// HOST backend, ranks as threads: dispatch and the weighted combine bitwise
// against the oracle (verify/expert_oracle.cpp) in EXPERT_MAJOR and
// EXPERT_PACKED, for every payload dtype, scales in both scale layouts,
// masked and bad ids, runtime max, EPLB, zero tokens, capacities that drop
// pairs, alignments 1/128/256, pre-weighted expert output, the zero-copy
// combine input, split phases and two micro-batches in flight; and the
// argument rules of the layout fields.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include "backend_table.hpp"
#include "error.hpp"
#include "expert_oracle.hpp"
#include "moe_ep_c.h"
#include "oracle.hpp"
#include "params.hpp"
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

moe_ep_dtype_t dt(uint8_t code, uint8_t bits) { return moe_ep_dtype_t{code, bits, 1}; }

enum class Calls { fused, split, two_in_flight, zero_copy };

const char* calls_name(Calls c) {
  switch (c) {
    case Calls::fused: return "fused";
    case Calls::split: return "split";
    case Calls::two_in_flight: return "two micro-batches";
    case Calls::zero_copy: return "zero-copy combine input";
  }
  return "?";
}

moe_ep_config_t config_of(Calls calls) {
  moe_ep_config_t c = host_config();
  c.micro_batches = calls == Calls::two_in_flight ? 2 : 1;
  c.zero_copy_combine = calls == Calls::zero_copy ? 1 : 0;
  return c;
}

moe_ep_handle_t create(const moe_ep_bootstrap_t& b, const WorkloadSpec& w, Calls calls) {
  moe_ep_params_t p = w.params();
  const moe_ep_config_t c = config_of(calls);
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) return nullptr;
  return h;
}

// Runs one round of `calls` on every rank; returns each rank's problems ("" = matched the oracle).
std::vector<std::string> run_case(const WorkloadSpec& spec, Calls calls,
                                  std::vector<ReceivedDispatch>* received = nullptr,
                                  std::vector<std::vector<uint8_t>>* combined = nullptr) {
  std::vector<std::string> problems(spec.world);
  if (received) received->assign(spec.world, ReceivedDispatch{});
  if (combined) combined->assign(spec.world, {});
  run_ranks(spec.world, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, spec, calls);
    if (h == nullptr) {
      problems[rank] = std::string("create: ") + moe_ep_last_error();
      return;
    }
    RankPair a(spec, rank, spec.seed % 2 == 0);
    WorkloadSpec second = spec;
    second.seed = spec.seed * 7 + 3;
    RankPair bpair(second, rank, false);
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    switch (calls) {
      case Calls::fused:
        if (a.ok(moe_ep_dispatch(h, a.args.get(), &r, nullptr), "dispatch")) {
          a.check_dispatch_result(r);
          if (a.ok(moe_ep_combine(h, a.eo.get(), nullptr, &cr, nullptr), "combine")) a.check_combine_result(cr);
        }
        break;
      case Calls::zero_copy:
        if (a.ok(moe_ep_dispatch(h, a.args.get(), &r, nullptr), "dispatch")) {
          a.check_dispatch_result(r);
          if (r.combine_input.data == nullptr) {
            a.problems = "no combine_input view";
            break;
          }
          std::memcpy(r.combine_input.data, a.expert_output.data(), a.expert_output.size());
          if (a.ok(moe_ep_combine(h, &r.combine_input, nullptr, &cr, nullptr), "combine")) a.check_combine_result(cr);
        }
        break;
      case Calls::split:
        if (a.ok(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr), "dispatch_send") &&
            a.ok(moe_ep_dispatch_recv(h, 0, &r, nullptr), "dispatch_recv")) {
          a.check_dispatch_result(r);
          if (a.ok(moe_ep_combine_send(h, 0, a.eo.get(), nullptr), "combine_send")) {
            std::fill(a.expert_output.begin(), a.expert_output.end(), uint8_t{0x7F});  // free once sent
            if (a.ok(moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr), "combine_recv")) a.check_combine_result(cr);
          }
        }
        break;
      case Calls::two_in_flight: {
        moe_ep_dispatch_result_t r1;
        moe_ep_dispatch_result_init(&r1, sizeof r1);
        moe_ep_combine_result_t cr1;
        moe_ep_combine_result_init(&cr1, sizeof cr1);
        const bool sent = a.ok(moe_ep_dispatch_send(h, 0, a.args.get(), nullptr), "dispatch_send 0") &&
                          bpair.ok(moe_ep_dispatch_send(h, 1, bpair.args.get(), nullptr), "dispatch_send 1") &&
                          a.ok(moe_ep_dispatch_recv(h, 0, &r, nullptr), "dispatch_recv 0") &&
                          bpair.ok(moe_ep_dispatch_recv(h, 1, &r1, nullptr), "dispatch_recv 1");
        if (!sent) break;
        a.check_dispatch_result(r);
        bpair.check_dispatch_result(r1);
        if (bpair.ok(moe_ep_combine_send(h, 1, bpair.eo.get(), nullptr), "combine_send 1") &&
            a.ok(moe_ep_combine_send(h, 0, a.eo.get(), nullptr), "combine_send 0") &&
            a.ok(moe_ep_combine_recv(h, 0, nullptr, &cr, nullptr), "combine_recv 0")) {
          a.check_combine_result(cr);
          if (bpair.ok(moe_ep_combine_recv(h, 1, nullptr, &cr1, nullptr), "combine_recv 1")) {
            bpair.check_combine_result(cr1);
          }
        }
        break;
      }
    }
    problems[rank] = a.problems + bpair.problems;
    if (received) (*received)[rank] = a.received;
    if (combined) (*combined)[rank] = a.combined;
    // Bad ids are reported there (on the rank that passed them); dropped pairs never are.
    bool bad_here = false;
    for (const WorkloadSpec* w : {&spec, static_cast<const WorkloadSpec*>(&second)}) {
      if (w != &spec && calls != Calls::two_in_flight) continue;
      for (int32_t id : make_routing(*w, rank).topk_ids)
        bad_here = bad_here || (w->owner(id) < 0 && id != w->invalid_expert_id);
    }
    moe_ep_status_t async = MOE_EP_SUCCESS;
    moe_ep_get_async_error(h, &async);
    const moe_ep_status_t expected = bad_here ? MOE_EP_ERROR_INVALID_INPUT : MOE_EP_SUCCESS;
    if (async != expected && problems[rank].empty()) {
      problems[rank] = std::string("moe_ep_get_async_error: expected ") + moe_ep_status_string(expected) + ", got " +
                       moe_ep_status_string(async) + ": " + moe_ep_last_error();
    }
    moe_ep_destroy(&h);
  });
  return problems;
}

WorkloadSpec base_spec(int world, int layout, uint64_t seed) {
  WorkloadSpec w = small_workload(world, seed);
  w.receive_layout = layout;
  return w;
}

// The case matrix: one change each from base_spec.
std::vector<WorkloadSpec> layout_cases(int layout, uint64_t seed) {
  std::vector<WorkloadSpec> out;
  for (int world : {1, 2, 3}) out.push_back(base_spec(world, layout, seed + world));
  auto add = [&](int world, auto&& edit) {
    WorkloadSpec w = base_spec(world, layout, seed ^ (0x1000 + out.size()));
    edit(w);
    out.push_back(w);
  };
  add(2, [](WorkloadSpec& w) {  // fp8 payload with fp32 scales, row-major
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
    w.scale_row_elems = 3;
  });
  add(2, [](WorkloadSpec& w) {  // ... and column-major (TMA-aligned) scales
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
    w.scale_row_elems = 5;
    w.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
  });
  add(3, [](WorkloadSpec& w) {
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT8_E5M2, 8);
    w.hidden_size = 33;
    w.scale_row_elems = 2;
    w.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
    w.combine_dtype = dt(MOE_EP_DTYPE_FLOAT, 16);
  });
  add(2, [](WorkloadSpec& w) {  // packed fp4 with fp8 scales (row-major only)
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT4_E2M1FN, 4);
    w.hidden_size = 67;
    w.scale_row_elems = 5;
    w.scale_dtype = dt(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
  });
  add(2, [](WorkloadSpec& w) {
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT, 32);
    w.combine_dtype = dt(MOE_EP_DTYPE_FLOAT, 32);
    w.hidden_size = 17;
  });
  add(2, [](WorkloadSpec& w) {
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT, 16);
    w.combine_dtype = dt(MOE_EP_DTYPE_FLOAT, 16);
    w.scale_row_elems = 2;
    w.scale_dtype = dt(MOE_EP_DTYPE_BFLOAT, 16);
  });
  add(2, [](WorkloadSpec& w) { w.routing.mask_fraction = 0.3; });
  add(2, [](WorkloadSpec& w) {
    w.invalid_expert_id = w.num_experts + 5;
    w.routing.mask_fraction = 0.25;
  });
  add(3, [](WorkloadSpec& w) {
    w.routing.bad_fraction = 0.15;
    w.tokens = {9, 9, 9};
  });
  add(3, [](WorkloadSpec& w) { w.runtime_max_tokens_per_rank = 4; });
  add(2, [](WorkloadSpec& w) {
    w.eplb_stats = true;
    w.eplb_given = false;
  });
  add(2, [](WorkloadSpec& w) {
    w.eplb_stats = true;
    w.eplb_given = true;
  });
  add(2, [](WorkloadSpec& w) { w.tokens = {0, 0}; });
  add(3, [](WorkloadSpec& w) { w.tokens = {0, 9, 4}; });
  add(2, [](WorkloadSpec& w) { w.weights = false; });
  add(2, [](WorkloadSpec& w) { w.expert_output_weighted = true; });
  add(2, [](WorkloadSpec& w) {  // top_k = all experts, several local picks per token
    w.top_k = w.num_experts;
    w.routing.kind = RoutingKind::zipf;
  });
  add(2, [](WorkloadSpec& w) {
    w.routing.kind = RoutingKind::zipf;
    w.routing.zipf_s = 2.0;
    w.tokens = {9, 9};
  });
  if (layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    for (int cap : {1, 2, 5}) {
      add(3, [cap](WorkloadSpec& w) {  // smaller capacities: pairs are dropped, counted
        w.expert_capacity = cap;
        w.routing.kind = RoutingKind::zipf;
        w.tokens = {9, 9, 9};
      });
    }
  } else {
    for (int a : {1, 2, 128, 256}) {
      add(2, [a](WorkloadSpec& w) { w.expert_alignment = a; });
    }
    add(2, [](WorkloadSpec& w) {  // a bound below the worst case: later experts lose rows
      w.expert_alignment = 4;
      w.expert_rows = 24;
      w.routing.kind = RoutingKind::zipf;
      w.tokens = {9, 9};
    });
    add(3, [](WorkloadSpec& w) {
      w.expert_alignment = 128;
      w.expert_rows = 384;
      w.tokens = {9, 9, 9};
      w.top_k = 4;
    });
    add(2, [](WorkloadSpec& w) {
      w.expert_alignment = 8;
      w.expert_rows = 8;  // one aligned block: every expert after the first rows is empty
      w.tokens = {9, 9};
    });
  }
  return out;
}

void check_all(const std::vector<WorkloadSpec>& specs, Calls calls) {
  for (const WorkloadSpec& spec : specs) {
    INFO(calls_name(calls) << ": " << spec.describe());
    const std::vector<std::string> problems = run_case(spec, calls);
    for (int r = 0; r < spec.world; ++r) {
      INFO("rank " << r);
      CHECK(problems[size_t(r)] == "");
    }
  }
}

}  // namespace

TEST_CASE("expert layouts: HOST dispatch and combine equal the oracle bitwise", "[layouts]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (int layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    INFO("layout " << layout);
    check_all(layout_cases(layout, seed), Calls::fused);
  }
}

TEST_CASE("expert layouts: split phases, two micro-batches and the zero-copy input give the same", "[layouts]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (int layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    INFO("layout " << layout);
    std::vector<WorkloadSpec> specs = layout_cases(layout, seed);
    for (Calls calls : {Calls::split, Calls::two_in_flight, Calls::zero_copy}) check_all(specs, calls);
  }
}

TEST_CASE("expert layouts: the fused and the split calls agree bit for bit", "[layouts]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  for (int layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    WorkloadSpec w = base_spec(3, layout, seed);
    w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT8_E4M3FN, 8);
    w.scale_row_elems = 4;
    w.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
    std::vector<ReceivedDispatch> fused_r, split_r;
    std::vector<std::vector<uint8_t>> fused_c, split_c;
    const auto p1 = run_case(w, Calls::fused, &fused_r, &fused_c);
    const auto p2 = run_case(w, Calls::split, &split_r, &split_c);
    for (int r = 0; r < w.world; ++r) {
      INFO("rank " << r << " " << w.describe());
      CHECK(p1[size_t(r)] == "");
      CHECK(p2[size_t(r)] == "");
      Verdict v = compare_dispatch(w, fused_r[size_t(r)], split_r[size_t(r)]);
      CHECK(v.wrong == 0);
      CHECK(fused_c[size_t(r)] == split_c[size_t(r)]);
    }
  }
}

TEST_CASE("expert layouts: a capacity that is too small drops pairs, counts them, and is no error", "[layouts]") {
  // Every token of both ranks picks experts 0 and 1 of rank 0, capacity 3:
  // expert 0 and 1 each get 2 * 6 pairs, keep 3.
  WorkloadSpec w = base_spec(2, MOE_EP_LAYOUT_EXPERT_MAJOR, 5);
  w.top_k = 2;
  w.expert_capacity = 3;
  w.max_tokens_per_rank = 6;
  w.tokens = {6, 6};
  std::vector<RankRouting> all = make_all_routing(w);
  for (RankRouting& r : all) {
    for (int t = 0; t < r.num_tokens; ++t) {
      r.topk_ids[size_t(t) * 2] = 0;
      r.topk_ids[size_t(t) * 2 + 1] = 1;
    }
  }
  const ExpertPlacement p = place_expert_rows(w, all, 0);
  CHECK(p.dropped == 18);
  CHECK(p.counts[0] == 3);
  CHECK(p.counts[1] == 3);
  CHECK(p.counts[2] == 0);
  // Rows in ascending (source rank, token, pick): rank 0's tokens 0..2.
  CHECK(p.sources[0] == 0);
  CHECK(p.sources[1] == 0);
  CHECK(p.sources[3 * 2 + 1] == 2);

  with_rank_handles(w, config_of(Calls::fused), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    RankInputs in = make_rank_inputs(w, rank);
    in.routing = all[size_t(rank)];
    DispatchArgs args(w, in.routing.num_tokens, host_memory(in));
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    RANK_REQUIRE(checks, rank, moe_ep_dispatch(h, args.get(), &r, nullptr) == MOE_EP_SUCCESS);
    Verdict v;
    const ReceivedDispatch got = read_dispatch(w, r, host_device(), read_host_memory, v);
    v.merge(check_dispatch(w, all, rank, got));
    RANK_CHECK(checks, rank, v.wrong == 0);
    RANK_CHECK(checks, rank, got.dropped_pairs.size() == 1 && got.dropped_pairs[0] == (rank == 0 ? 18 : 0));
    RANK_CHECK(checks, rank, got.local_expert_counts[0] == (rank == 0 ? 12 : 0));  // received, before the capacity
    moe_ep_status_t async = MOE_EP_ERROR_INTERNAL;
    RANK_CHECK(checks, rank, moe_ep_get_async_error(h, &async) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, async == MOE_EP_SUCCESS);
    std::vector<uint8_t> eo = make_expert_output(w, rank);
    TensorView eov = expert_output_view(w, eo.data(), host_device(), true);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    RANK_REQUIRE(checks, rank, moe_ep_combine(h, eov.get(), nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
    Verdict cv;
    const std::vector<uint8_t> out = read_combine(w, cr, in.routing.num_tokens, host_device(), read_host_memory, cv);
    cv.merge(check_combine(w, all, rank, out));
    RANK_CHECK(checks, rank, cv.wrong == 0);
  });
}

TEST_CASE("expert layouts: EXPERT_PACKED offsets are aligned and the total is offsets[E_local]", "[layouts]") {
  for (int a : {1, 128, 256}) {
    WorkloadSpec w = base_spec(2, MOE_EP_LAYOUT_EXPERT_PACKED, 11 + a);
    w.expert_alignment = a;
    w.tokens = {9, 9};
    const ExpertPlacement p = place_expert_rows(w, make_all_routing(w), 1);
    INFO("alignment " << a);
    int64_t total = 0;
    for (int e = 0; e < w.experts_per_rank(); ++e) {
      CHECK(p.offsets[size_t(e)] % a == 0);
      CHECK(p.offsets[size_t(e)] >= total);
      total = p.offsets[size_t(e)] + p.counts[size_t(e)];
    }
    CHECK(p.offsets.back() == (total + a - 1) / a * a);
    CHECK(p.dropped == 0);  // the default bound is the worst case
    CHECK(p.offsets.back() <= w.packed_rows());
  }
}

TEST_CASE("expert layouts: the workspace and the worst-case defaults", "[layouts]") {
  moe_ep_params_t p = make_params(16, 4, 64, 128);
  moe_ep_config_t c = host_config();
  uint64_t rank_major = 0, packed = 0, packed128 = 0, major = 0;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &rank_major) == MOE_EP_SUCCESS);
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &packed) == MOE_EP_SUCCESS);
  p.expert_alignment = 128;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &packed128) == MOE_EP_SUCCESS);
  p.expert_alignment = 0;
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_MAJOR;
  REQUIRE(moe_ep_workspace_size(&p, &c, 2, &major) == MOE_EP_SUCCESS);
  CHECK(packed > rank_major);
  CHECK(packed128 > packed);
  CHECK(major > rank_major);

  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), 2, 0);
  CHECK(l.expert_capacity == 128);  // world * max_tokens_per_rank
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  p.expert_alignment = 128;
  const moe_ep::Layout lp = moe_ep::make_layout(moe_ep::read_params(&p), 2, 0);
  // 2 * 64 * min(4, 8) + 8 * 127 = 1528, rounded down to a multiple of 128.
  CHECK(lp.expert_rows == 1408);
  WorkloadSpec w;
  w.world = 2;
  w.num_experts = 16;
  w.top_k = 4;
  w.max_tokens_per_rank = 64;
  w.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  w.expert_alignment = 128;
  CHECK(w.packed_rows() == lp.expert_rows);  // the oracle's own reading of the rule
}

namespace {

std::string refusal(const moe_ep_params_t& p, int32_t world = 2) {
  uint64_t bytes = 0;
  moe_ep_config_t c = host_config();
  const moe_ep_status_t s = moe_ep_workspace_size(&p, &c, world, &bytes);
  return std::string(moe_ep_status_string(s)) + ": " + moe_ep_last_error();
}

}  // namespace

TEST_CASE("expert layouts: every field is validated, naming it, the expected and the actual value", "[layouts]") {
  moe_ep_params_t p = make_params(8, 2, 4, 16);
  p.receive_layout = 3;
  CHECK_THAT(refusal(p), Contains("INVALID_ARGUMENT") && Contains("params->receive_layout") &&
                             Contains("EXPERT_PACKED (2)") && Contains("got 3"));
  p = make_params(8, 2, 4, 16);
  p.expert_capacity = 4;
  CHECK_THAT(refusal(p), Contains("params->expert_capacity") && Contains("EXPERT_MAJOR only") && Contains("got 4"));
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_MAJOR;
  p.expert_capacity = 9;  // world 2 * 4 tokens = 8 at most
  CHECK_THAT(refusal(p), Contains("params->expert_capacity") && Contains("[1, world_size * max_tokens_per_rank = 8]") &&
                             Contains("got 9"));
  p.expert_capacity = -1;
  CHECK_THAT(refusal(p), Contains("params->expert_capacity") && Contains(">= 0") && Contains("got -1"));
  p = make_params(8, 2, 4, 16);
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  p.expert_alignment = 257;
  CHECK_THAT(refusal(p), Contains("params->expert_alignment") && Contains("[1, 256]") && Contains("got 257"));
  p.expert_alignment = 128;
  p.expert_rows = 100;
  CHECK_THAT(refusal(p),
             Contains("params->expert_rows") && Contains("multiple of expert_alignment (128)") && Contains("got 100"));
  p.expert_rows = 128 * 100;
  CHECK_THAT(refusal(p),
             Contains("params->expert_rows") && Contains("at most the worst case") && Contains("got 12800"));
  p.expert_rows = 0;
  p.expert_output_weighted = 2;
  CHECK_THAT(refusal(p), Contains("params->expert_output_weighted") && Contains("0 or 1") && Contains("got 2"));
  p.expert_output_weighted = 0;
  p.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
  CHECK_THAT(refusal(p), Contains("params->scale_layout") && Contains("scale_row_elems is 0"));
  p.scale_row_elems = 2;
  p.scale_dtype = dt(MOE_EP_DTYPE_BFLOAT, 16);
  CHECK_THAT(refusal(p), Contains("params->scale_layout") && Contains("fp32 scales only"));
  p.scale_dtype = dt(MOE_EP_DTYPE_FLOAT, 32);
  CHECK(refusal(p).rfind("MOE_EP_SUCCESS", 0) == 0);
  p.scale_layout = 2;
  CHECK_THAT(refusal(p), Contains("params->scale_layout") && Contains("COLUMN_MAJOR (1)") && Contains("got 2"));
  // A worst case beyond int32 row indices needs an explicit bound.
  p = make_params(8192, 128, 1 << 20, 16);
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  CHECK_THAT(refusal(p, 64), Contains("params->expert_rows") && Contains("int32 row indices") &&
                                 Contains("8589934592 rows here") && Contains("got 0"));
  p.expert_rows = 1 << 20;
  CHECK(refusal(p, 64).rfind("MOE_EP_SUCCESS", 0) == 0);
  p = make_params(8, 2, 4, 16);
  p.expert_alignment = 4;
  CHECK_THAT(refusal(p), Contains("params->expert_alignment") && Contains("EXPERT_PACKED only"));
  p = make_params(8, 2, 4, 16);
  p.expert_output_weighted = 1;
  CHECK_THAT(refusal(p), Contains("params->expert_output_weighted") && Contains("EXPERT_MAJOR and EXPERT_PACKED"));
}

TEST_CASE("expert layouts: the GPU backends refuse them with UNSUPPORTED, in one place", "[layouts]") {
  moe_ep_params_t p = make_params(8, 2, 4, 16);
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), 2, 0);
  for (int32_t backend : {MOE_EP_BACKEND_NVLINK_TWO_SIDED, MOE_EP_BACKEND_NCCL}) {
    if (moe_ep::backend_entry(backend).expert_layouts) {  // a GPU backend that has them takes them
      CHECK_NOTHROW(moe_ep::check_backend_capabilities(backend, l, 1));
      continue;
    }
    try {
      moe_ep::check_backend_capabilities(backend, l, 1);
      FAIL("expected UNSUPPORTED");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_UNSUPPORTED);
      CHECK_THAT(e.what(), Contains("params->receive_layout") && Contains("RANK_MAJOR only") &&
                               Contains("MOE_EP_LAYOUT_EXPERT_PACKED"));
    }
  }
  CHECK_NOTHROW(moe_ep::check_backend_capabilities(MOE_EP_BACKEND_HOST, l, 2));
}

TEST_CASE("expert layouts: combine refuses an expert_output of the rank-major shape", "[layouts]") {
  WorkloadSpec w = base_spec(2, MOE_EP_LAYOUT_EXPERT_PACKED, 3);
  with_rank_handles(w, config_of(Calls::fused), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    RankPair pair(w, rank);
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    RANK_REQUIRE(checks, rank, moe_ep_dispatch(h, pair.args.get(), &r, nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, r.topk_ids.data == nullptr && r.topk_weights.data == nullptr);
    WorkloadSpec rank_major = w;
    rank_major.receive_layout = MOE_EP_LAYOUT_RANK_MAJOR;
    std::vector<uint8_t> eo = make_expert_output(rank_major, rank);
    TensorView eov = expert_output_view(rank_major, eo.data(), host_device());
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    RANK_CHECK(checks, rank, moe_ep_combine(h, eov.get(), nullptr, &cr, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    const std::string message = moe_ep_last_error();
    RANK_CHECK(checks, rank, message.find("expert_output") != std::string::npos);
    RANK_CHECK(checks, rank, moe_ep_combine(h, pair.eo.get(), nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
  });
}

TEST_CASE("expert layouts: a result struct that ends before the expert fields still gets the others", "[layouts]") {
  WorkloadSpec w = base_spec(1, MOE_EP_LAYOUT_EXPERT_MAJOR, 8);
  with_rank_handles(w, config_of(Calls::fused), [&](int rank, moe_ep_handle_t h, RankChecks& checks) {
    RankPair pair(w, rank, true);
    moe_ep_dispatch_result_t r;
    std::memset(&r, 0xCD, sizeof r);
    const size_t old_size = offsetof(moe_ep_dispatch_result_t, expert_counts);
    RANK_REQUIRE(checks, rank, moe_ep_dispatch_result_init(&r, old_size) == MOE_EP_SUCCESS);
    RANK_REQUIRE(checks, rank, moe_ep_dispatch(h, pair.args.get(), &r, nullptr) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, r.hidden_states.ndim == 3);
    unsigned char tail[sizeof r - offsetof(moe_ep_dispatch_result_t, expert_counts)];
    std::memcpy(tail, reinterpret_cast<unsigned char*>(&r) + old_size, sizeof tail);
    bool untouched = true;
    for (unsigned char c : tail) untouched = untouched && c == 0xCD;
    RANK_CHECK(checks, rank, untouched);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    RANK_CHECK(checks, rank, moe_ep_combine(h, pair.eo.get(), nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
  });
}

// The FP8 wire (docs/semantics.md, "A low-precision wire") on the HOST backend
// against the oracle's own quantizer: every receive layout, every way of
// calling, both scale rules, dequantized or not, the combine wire alone and
// with the dispatch wire.
TEST_CASE("wire: HOST dispatch and combine with an FP8 wire equal the oracle bitwise", "[wire]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<WorkloadSpec> specs;
  for (int layout : {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    auto add = [&](int world, auto&& edit) {
      WorkloadSpec w = base_spec(world, layout, seed ^ (0x2000 + specs.size()));
      edit(w);
      specs.push_back(w);
    };
    for (int world : {1, 2, 3}) {
      for (int rule : {MOE_EP_WIRE_SCALE_FP32, MOE_EP_WIRE_SCALE_UE8M0}) {
        add(world, [rule](WorkloadSpec& w) {  // both wires, a short last block
          w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
          w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
          w.wire_scale = rule;
          w.hidden_size = 129;
        });
      }
    }
    add(2, [](WorkloadSpec& w) {  // dispatch wire only, dequantized to fp16
      w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.dispatch_dequantize = true;
      w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT, 16);
      w.hidden_size = 100;
    });
    add(3, [](WorkloadSpec& w) {  // fp32 rows dequantized, UE8M0, runtime max
      w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.dispatch_dequantize = true;
      w.wire_scale = MOE_EP_WIRE_SCALE_UE8M0;
      w.hidden_dtype = dt(MOE_EP_DTYPE_FLOAT, 32);
      w.runtime_max_tokens_per_rank = 4;
    });
    add(2, [](WorkloadSpec& w) {  // combine wire only, fp32 and fp16 outputs
      w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.combine_dtype = dt(MOE_EP_DTYPE_FLOAT, 32);
      w.hidden_size = 256;
    });
    add(3, [](WorkloadSpec& w) {
      w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.wire_scale = MOE_EP_WIRE_SCALE_UE8M0;
      w.combine_dtype = dt(MOE_EP_DTYPE_FLOAT, 16);
      w.routing.bad_fraction = 0.15;  // bad ids: dropped, reported
      w.tokens = {9, 9, 9};
    });
    add(2, [](WorkloadSpec& w) {  // a 1-element row: one block of one
      w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
      w.hidden_size = 1;
      w.routing.mask_fraction = 0.3;
    });
    if (layout != MOE_EP_LAYOUT_RANK_MAJOR) {
      add(2, [](WorkloadSpec& w) {  // the library's scales in the column-major (TMA-aligned) layout
        w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
        w.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
        w.hidden_size = 300;
      });
      add(3, [](WorkloadSpec& w) {
        w.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
        w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
        w.expert_output_weighted = true;
        w.weights = false;
      });
    }
  }
  for (Calls calls : {Calls::fused, Calls::split, Calls::two_in_flight, Calls::zero_copy}) check_all(specs, calls);
}
