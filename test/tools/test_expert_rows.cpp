// The bench's check of an expert layout on its pair rows only
// (tools/conformance/expert_rows.hpp), on the HOST backend with ranks as
// threads: on a correct result it finds nothing, and on results corrupted in
// a pair row's payload or scales, in a padding row's payload, in padding
// metadata and in the counts it counts exactly what the oracle's full path
// (read_dispatch + check_dispatch) counts; and combine of the expert output
// it writes (NaN on padding rows) matches the oracle.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "dtypes.hpp"
#include "expert_oracle.hpp"
#include "expert_rows.hpp"
#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"
#include "workload.hpp"

using namespace moe_ep_verify;

namespace {

struct Variant {
  const char* name;
  int layout;
  bool fp8_rows = false;       // e4m3 rows with fp32 scales
  bool column_scales = false;  // COLUMN_MAJOR scales
  bool fp8_wire = false;       // FP8 dispatch and combine wires on bf16 rows
};

WorkloadSpec spec_of(const Variant& v) {
  WorkloadSpec w;
  w.world = 2;
  w.num_experts = 8;
  w.top_k = 3;
  w.max_tokens_per_rank = 16;
  w.hidden_size = 256;
  w.tokens = {16, 9};
  w.seed = 7;
  w.receive_layout = v.layout;
  if (v.layout == MOE_EP_LAYOUT_EXPERT_MAJOR) w.expert_capacity = 9;  // some experts drop pairs, some pad
  if (v.layout == MOE_EP_LAYOUT_EXPERT_PACKED) w.expert_alignment = 4;
  if (v.fp8_rows) {
    w.hidden_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
    w.scale_row_elems = 2;
    w.scale_dtype = moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1};
  }
  if (v.column_scales) w.scale_layout = MOE_EP_SCALES_COLUMN_MAJOR;
  if (v.fp8_wire) w.dispatch_wire = w.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  return w;
}

int64_t full_check(const WorkloadSpec& w, const std::vector<RankRouting>& all, int rank,
                   const moe_ep_dispatch_result_t& r) {
  Verdict v;
  const ReceivedDispatch got = read_dispatch(w, r, host_device(), read_host_memory, v);
  v.merge(check_dispatch(w, all, rank, got));
  return v.wrong;
}

int64_t pair_row_check(const WorkloadSpec& w, const std::vector<RankRouting>& all, int rank,
                       const moe_ep_dispatch_result_t& r) {
  return moe_ep_tool::check_expert_layout_dispatch(w, all, rank, r, moe_ep_tool::Place{}, nullptr).wrong;
}

// One rank's run; returns what went wrong ("" = nothing).
std::string run_rank(const WorkloadSpec& w, int rank, const moe_ep_bootstrap_t& b) {
  std::string problems;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) problems += "rank " + std::to_string(rank) + ": " + what + "\n";
  };
  moe_ep_params_t params = w.params();
  const moe_ep_config_t config = moe_ep_test::host_config();
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &params, &config, &h) != MOE_EP_SUCCESS) return std::string("create: ") + moe_ep_last_error();
  const std::vector<RankRouting> all = make_all_routing(w);
  RankInputs in = make_rank_inputs(w, rank);
  DispatchArgs args(w, in.routing.num_tokens, host_memory(in));
  moe_ep_dispatch_result_t r;
  moe_ep_dispatch_result_init(&r, sizeof r);
  if (moe_ep_dispatch(h, args.get(), &r, nullptr) != MOE_EP_SUCCESS) {
    moe_ep_destroy(&h);
    return std::string("dispatch: ") + moe_ep_last_error();
  }
  expect(full_check(w, all, rank, r) == 0, "the oracle finds the HOST result wrong");
  expect(pair_row_check(w, all, rank, r) == 0, "the pair-row check finds the HOST result wrong");

  // Each corruption: both checks count the same, `want` (-1: at least one).
  auto corrupt = [&](const char* what, void* at, size_t bytes, int64_t want) {
    if (at == nullptr) return;
    std::vector<uint8_t> saved(bytes);
    std::memcpy(saved.data(), at, bytes);
    for (size_t i = 0; i < bytes; ++i) static_cast<uint8_t*>(at)[i] ^= 0x5A;
    const int64_t full = full_check(w, all, rank, r), pairs = pair_row_check(w, all, rank, r);
    expect(full == pairs, std::string(what) + ": the oracle counts " + std::to_string(full) + ", the pair-row check " +
                              std::to_string(pairs));
    expect(want < 0 ? full > 0 : full == want, std::string(what) + ": the oracle counts " + std::to_string(full) +
                                                   ", expected " + (want < 0 ? ">= 1" : std::to_string(want)));
    std::memcpy(at, saved.data(), bytes);
  };
  const ExpertPlacement p = place_expert_rows(w, all, rank);
  const int64_t rows = w.expert_layout_rows();
  int64_t pair_row = -1, padding_row = -1;
  for (int64_t row = 0; row < rows; ++row) {
    if (p.sources[size_t(row) * 3] >= 0 && pair_row < 0) pair_row = row;
    if (p.sources[size_t(row) * 3] < 0 && padding_row < 0) padding_row = row;
  }
  const uint64_t hb = w.recv_hidden_row_bytes();
  auto* hidden = static_cast<uint8_t*>(r.hidden_states.data);
  if (pair_row >= 0) {
    corrupt("a pair row's payload", hidden + uint64_t(pair_row) * hb, 1, 1);
    if (w.recv_scale_row_elems()) {
      const int64_t at = w.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR ? column_scale_index(w, pair_row, 1)
                                                                      : pair_row * w.recv_scale_row_elems() + 1;
      corrupt("a pair row's scale", static_cast<float*>(r.hidden_states_scale.data) + at, sizeof(float), 1);
    }
  }
  if (padding_row >= 0) {
    corrupt("a padding row's payload", hidden + uint64_t(padding_row) * hb, hb, 0);
    corrupt("a padding row's source", static_cast<int32_t*>(r.row_sources.data) + padding_row * 3, sizeof(int32_t), 1);
    corrupt("a padding row's weight", static_cast<float*>(r.row_weights.data) + padding_row, sizeof(float), 1);
  }
  corrupt("expert_counts", r.expert_counts.data, sizeof(int32_t), 1);
  corrupt("recv_counts", r.recv_counts.data, sizeof(int32_t), 1);
  corrupt("local_expert_counts", r.local_expert_counts.data, sizeof(int32_t), 1);
  corrupt("dropped_pairs", r.dropped_pairs.data, sizeof(int32_t), 1);

  // Combine of the expert output written on the pair rows (NaN elsewhere).
  const uint64_t rb = w.combine_row_bytes();
  std::vector<uint8_t> expert_output(uint64_t(w.combine_rows()) * rb);
  moe_ep_tool::write_expert_layout_output(w, rank, all, moe_ep_tool::Place{}, expert_output.data(), nullptr);
  if (padding_row >= 0) {
    expect(std::isnan(load_float(w.combine_dtype, expert_output.data(), padding_row * w.hidden_size)),
           "a padding row of the expert output is not NaN");
  }
  if (pair_row >= 0) {
    expect(load_float(w.combine_dtype, expert_output.data(), pair_row * w.hidden_size + 3) ==
               expert_output_value(w, rank, pair_row, 3),
           "a pair row of the expert output is not the oracle's value");
  }
  const TensorView eo = expert_output_view(w, expert_output.data(), host_device(), false);
  moe_ep_combine_result_t cr;
  moe_ep_combine_result_init(&cr, sizeof cr);
  if (moe_ep_combine(h, eo.get(), nullptr, &cr, nullptr) != MOE_EP_SUCCESS) {
    expect(false, std::string("combine: ") + moe_ep_last_error());
  } else {
    Verdict v;
    const std::vector<uint8_t> out = read_combine(w, cr, in.routing.num_tokens, host_device(), read_host_memory, v);
    if (in.routing.num_tokens > 0) v.merge(check_combine(w, all, rank, out));
    expect(v.wrong == 0, "combine of the pair-row expert output: " + std::to_string(v.wrong) + " wrong\n" + v.details);
  }
  moe_ep_destroy(&h);
  return problems;
}

}  // namespace

TEST_CASE("the bench's pair-row check of an expert layout counts what the oracle counts", "[tools]") {
  const Variant variants[] = {
      {"EXPERT_MAJOR bf16", MOE_EP_LAYOUT_EXPERT_MAJOR},
      {"EXPERT_PACKED bf16", MOE_EP_LAYOUT_EXPERT_PACKED},
      {"EXPERT_MAJOR fp8 rows, row-major scales", MOE_EP_LAYOUT_EXPERT_MAJOR, true},
      {"EXPERT_PACKED fp8 rows, column-major scales", MOE_EP_LAYOUT_EXPERT_PACKED, true, true},
      {"EXPERT_MAJOR fp8 rows, column-major scales", MOE_EP_LAYOUT_EXPERT_MAJOR, true, true},
      {"EXPERT_PACKED FP8 wires", MOE_EP_LAYOUT_EXPERT_PACKED, false, false, true},
  };
  for (const Variant& v : variants) {
    INFO(v.name);
    const WorkloadSpec w = spec_of(v);
    std::vector<std::string> problems(size_t(w.world));
    moe_ep_test::run_ranks(
        w.world, [&](int rank, const moe_ep_bootstrap_t& b) { problems[size_t(rank)] = run_rank(w, rank, b); });
    for (const std::string& p : problems) CHECK(p == "");
  }
}
