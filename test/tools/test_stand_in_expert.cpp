// The host side of bench --decode-step's stand-in expert: the element rule,
// the host run over a receive layout (padding rows untouched), and the model
// the check uses, against a dispatch -> stand-in -> combine simulated here
// from the workload alone (rank-major receive rows, ranks summed in order).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtypes.hpp"
#include "oracle.hpp"
#include "stand_in_expert.hpp"
#include "workload.hpp"

using namespace moe_ep_verify;
using moe_ep_tool::is_received_row;
using moe_ep_tool::kStandInExpertScale;
using moe_ep_tool::run_stand_in_expert_host;
using moe_ep_tool::stand_in_expert_model;
using moe_ep_tool::stand_in_expert_value;
using moe_ep_tool::StandInExpertArgs;

TEST_CASE("stand-in expert: scale times each normal value, 0 for the rest", "[stand_in_expert]") {
  CHECK(kStandInExpertScale == 2.0f);
  CHECK(stand_in_expert_value(1.5f) == 3.0f);
  CHECK(stand_in_expert_value(-0.25f) == -0.5f);
  CHECK(stand_in_expert_value(std::numeric_limits<float>::min()) == 2 * std::numeric_limits<float>::min());
  CHECK(stand_in_expert_value(0.0f) == 0.0f);
  CHECK(stand_in_expert_value(std::numeric_limits<float>::denorm_min()) == 0.0f);
  CHECK(stand_in_expert_value(std::numeric_limits<float>::quiet_NaN()) == 0.0f);
  CHECK(stand_in_expert_value(std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(stand_in_expert_value(-std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(stand_in_expert_value(std::numeric_limits<float>::max()) == 0.0f);  // 2x would overflow
  CHECK(stand_in_expert_value(std::numeric_limits<float>::max() / 2) == std::numeric_limits<float>::max());
}

TEST_CASE("stand-in expert: received rows only", "[stand_in_expert]") {
  const int world = 2, tpr = 3, hidden = 4;
  const int32_t counts[world] = {1, 2};  // rows 0 (source 0) and 3, 4 (source 1) hold tokens
  for (int row = 0; row < world * tpr; ++row) {
    CHECK(is_received_row(row, tpr, counts) == (row == 0 || row == 3 || row == 4));
  }
  std::vector<uint16_t> rows(world * tpr * hidden);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = float_to_bf16_bits(0.5f + float(i));
  const std::vector<float> sentinel(rows.size(), -7.0f);
  for (const char* out_name : {"fp32", "bf16"}) {
    const moe_ep_dtype_t out_dtype = parse_dtype(out_name);
    std::vector<uint8_t> out(rows.size() * 4);
    for (size_t i = 0; i < rows.size(); ++i) store_float(out_dtype, out.data(), int64_t(i), sentinel[i]);
    StandInExpertArgs a;
    a.rows = rows.data();
    a.rows_dtype = bf16_dtype();
    a.recv_counts = counts;
    a.out = out.data();
    a.out_dtype = out_dtype;
    a.world = world;
    a.tokens_per_rank = tpr;
    a.hidden = hidden;
    run_stand_in_expert_host(a);
    for (int row = 0; row < world * tpr; ++row) {
      for (int h = 0; h < hidden; ++h) {
        const int64_t i = int64_t(row) * hidden + h;
        const float want = is_received_row(row, tpr, counts) ? 2.0f * bf16_bits_to_float(rows[i]) : -7.0f;
        INFO(out_name << " row " << row << " element " << h);
        CHECK(load_float(out_dtype, out.data(), i) == want);
      }
    }
  }
}

namespace {

// Rank `me`'s combine output when every rank ran `expert_scale` * x (the
// stand-in's rule with another scale, for the negative case) over its
// receive rows, built from the workload: token t of rank s sits on rank d in
// row s * tpr + (its place among s's tokens bound for d).
std::vector<uint8_t> simulate_step(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me, bool stand_in) {
  const int H = s.hidden_size, tpr = s.tokens_per_rank();
  std::vector<std::vector<uint8_t>> expert_rows(s.world);
  for (int d = 0; d < s.world; ++d) {
    std::vector<uint8_t> received(size_t(s.world) * tpr * s.hidden_row_bytes());
    std::vector<int32_t> counts(s.world, 0);
    for (int src = 0; src < s.world; ++src) {
      for (int t = 0; t < all[src].num_tokens; ++t) {
        if (!goes_to(s, all[src], t, d)) continue;
        fill_hidden_row(s, src, t, received.data() + (size_t(src) * tpr + counts[src]++) * s.hidden_row_bytes());
      }
    }
    expert_rows[d].assign(size_t(s.world) * tpr * s.combine_row_bytes(), 0);
    StandInExpertArgs a;
    a.rows = received.data();
    a.rows_dtype = s.hidden_dtype;
    a.recv_counts = counts.data();
    a.out = expert_rows[d].data();
    a.out_dtype = s.combine_dtype;
    a.world = s.world;
    a.tokens_per_rank = tpr;
    a.hidden = H;
    if (stand_in) {
      run_stand_in_expert_host(a);
    } else {  // an expert that forgot the scale
      for (size_t i = 0; i < size_t(s.world) * tpr * H; ++i) {
        store_float(s.combine_dtype, a.out, int64_t(i), load_float(s.hidden_dtype, received.data(), int64_t(i)));
      }
    }
  }
  std::vector<uint8_t> out(size_t(all[me].num_tokens) * s.combine_row_bytes());
  std::vector<int> sent(s.world, 0);
  for (int t = 0; t < all[me].num_tokens; ++t) {
    std::vector<float> acc(H, 0.0f);
    for (int d = 0; d < s.world; ++d) {
      if (!goes_to(s, all[me], t, d)) continue;
      const int64_t row = int64_t(me) * tpr + sent[d]++;
      for (int h = 0; h < H; ++h) acc[h] += load_float(s.combine_dtype, expert_rows[d].data(), row * H + h);
    }
    for (int h = 0; h < H; ++h) store_float(s.combine_dtype, out.data(), int64_t(t) * H + h, acc[h]);
  }
  return out;
}

}  // namespace

TEST_CASE("stand-in expert: the check's model matches a simulated decode step", "[stand_in_expert]") {
  for (const char* combine : {"bf16", "fp32"}) {
    WorkloadSpec s;
    s.world = 3;
    s.num_experts = 9;
    s.top_k = 2;
    s.max_tokens_per_rank = 6;
    s.hidden_size = 40;
    s.hidden_dtype = bf16_dtype();
    s.combine_dtype = parse_dtype(combine);
    s.tokens = {6, 4, 5};
    s.seed = 77;
    REQUIRE(moe_ep_tool::stand_in_expert_refusal(s).empty());
    const std::vector<RankRouting> all = make_all_routing(s);
    for (int me = 0; me < s.world; ++me) {
      INFO(combine << " rank " << me);
      const ExpertRowModel model = stand_in_expert_model(s, me);
      std::vector<uint8_t> out = simulate_step(s, all, me, true);
      CHECK(check_combine(s, all, me, out, model).wrong == 0);
      // The check notices one wrong element, and an expert without the scale.
      store_float(s.combine_dtype, out.data(), 3, load_float(s.combine_dtype, out.data(), 3) + 1.0f);
      CHECK(check_combine(s, all, me, out, model).wrong == 1);
      CHECK(check_combine(s, all, me, simulate_step(s, all, me, false), model).wrong > 0);
      // And the default model (make_expert_output) is a different expert.
      CHECK(check_combine(s, all, me, simulate_step(s, all, me, true)).wrong > 0);
    }
  }
}

TEST_CASE("stand-in expert: refuses payloads it cannot read", "[stand_in_expert]") {
  WorkloadSpec s;
  s.hidden_dtype = fp8_e4m3_dtype();
  s.scale_row_elems = 1;
  CHECK(moe_ep_tool::stand_in_expert_refusal(s).find("--dtype") != std::string::npos);
  s = WorkloadSpec{};
  CHECK(moe_ep_tool::stand_in_expert_refusal(s).empty());
}
