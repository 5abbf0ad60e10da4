#include "check.hpp"

#include <algorithm>

#include "counter_rng.hpp"
#include "dtypes.hpp"
#include "errors.hpp"

namespace moe_ep_tool {

namespace {

// Builds one case from a small default shape (H 64, top-2, 4 experts per rank,
// 16 tokens per rank); each case changes only what it is about.
class Case {
 public:
  explicit Case(const std::string& name) {
    c_.name = name;
    c_.shape.hidden_size = 64;
    c_.shape.top_k = 2;
    c_.shape.max_tokens_per_rank = 16;
  }
  Case& hidden(int h) {
    c_.shape.hidden_size = h;
    return *this;
  }
  Case& dtypes(const char* hidden_dtype, const char* combine_dtype) {
    c_.shape.hidden_dtype = parse_dtype(hidden_dtype);
    c_.shape.combine_dtype = parse_dtype(combine_dtype);
    return *this;
  }
  Case& scales(int elems, const char* dtype) {
    c_.shape.scale_row_elems = elems;
    c_.shape.scale_dtype = parse_dtype(dtype);
    return *this;
  }
  Case& top_k(int k) {
    c_.shape.top_k = k;
    return *this;
  }
  Case& top_k_all() {
    c_.top_k_is_all = true;
    return *this;
  }
  Case& experts_per_rank(int n) {
    c_.experts_per_rank = n;
    return *this;
  }
  Case& min_experts(int n) {
    c_.min_experts = n;
    return *this;
  }
  Case& max_tokens(int n) {
    c_.shape.max_tokens_per_rank = n;
    return *this;
  }
  Case& runtime_max(int n) {
    c_.shape.runtime_max_tokens_per_rank = n;
    return *this;
  }
  Case& tokens(TokenRule rule) {
    c_.tokens = rule;
    return *this;
  }
  Case& mask(double fraction) {
    c_.shape.routing.mask_fraction = fraction;
    return *this;
  }
  Case& bad_ids(double fraction) {
    c_.shape.routing.bad_fraction = fraction;
    return *this;
  }
  Case& invalid_id(int id) {
    c_.shape.invalid_expert_id = id;
    return *this;
  }
  Case& invalid_id_above_experts() {
    c_.invalid_above = true;
    return *this;
  }
  Case& no_weights() {
    c_.shape.weights = false;
    return *this;
  }
  Case& eplb(bool given) {
    c_.shape.eplb_stats = true;
    c_.shape.eplb_given = given;
    return *this;
  }
  Case& zero_copy_combine() {
    c_.zero_copy = true;
    return *this;
  }
  Case& routing(RoutingKind kind, double zipf_s = 0) {
    c_.shape.routing.kind = kind;
    c_.shape.routing.zipf_s = zipf_s;
    return *this;
  }
  Case& expert_capacity(int rows) {
    c_.expert_capacity = rows;
    c_.expert_layouts_only = true;
    return *this;
  }
  Case& expert_alignment(int rows, int bound = 0) {
    c_.expert_alignment = rows;
    c_.expert_rows = bound;
    c_.expert_layouts_only = true;
    return *this;
  }
  Case& expert_output_weighted() {
    c_.expert_output_weighted = true;
    c_.expert_layouts_only = true;
    return *this;
  }
  Case& column_major_scales() {
    c_.column_major_scales = true;
    c_.expert_layouts_only = true;
    return *this;
  }
  operator CheckCase() const { return c_; }

 private:
  CheckCase c_;
};

}  // namespace

std::vector<CheckCase> check_cases() {
  return {
      Case("basic_bf16").hidden(256).max_tokens(32),
      Case("deepseek_shape").hidden(7168).top_k(8).min_experts(256).max_tokens(6),
      // Hidden sizes and dtypes; odd sizes rule out any multiple-of-16-bytes shortcut.
      Case("hidden_1").hidden(1),
      Case("hidden_7_fp16").hidden(7).dtypes("fp16", "fp16").top_k(3).experts_per_rank(3),
      Case("hidden_33_fp32").hidden(33).dtypes("fp32", "fp32").experts_per_rank(5),
      Case("combine_fp32_h129").hidden(129).dtypes("bf16", "fp32").top_k(4),
      Case("combine_fp16_h130").hidden(130).dtypes("bf16", "fp16"),
      // Quantised payloads travel as opaque bytes with row-aligned scales.
      Case("fp8_scales").hidden(512).dtypes("fp8_e4m3", "bf16").scales(4, "fp32").top_k(4).experts_per_rank(8),
      Case("fp8_e5m2_odd").hidden(129).dtypes("fp8_e5m2", "fp16").scales(2, "fp32").experts_per_rank(3),
      Case("fp4_packed_odd").hidden(67).dtypes("fp4", "bf16").scales(5, "fp8_e4m3"),
      Case("bf16_scales_h96").hidden(96).scales(3, "bf16"),
      // top_k and expert counts (no multiple-of-4 rule).
      Case("topk_1").top_k(1),
      Case("topk_all").top_k_all().experts_per_rank(3).hidden(32),
      Case("topk_32").top_k(32).min_experts(40).hidden(96),
      Case("experts_1_per_rank").experts_per_rank(1).top_k(1),
      Case("experts_3_per_rank").experts_per_rank(3),
      Case("experts_5_per_rank").experts_per_rank(5).top_k(3),
      // Token counts: none, unequal, full, many, one.
      Case("tokens_zero_all").tokens(TokenRule::zero),
      Case("tokens_zero_rank0").tokens(TokenRule::rank0_zero),
      Case("tokens_unequal").tokens(TokenRule::unequal),
      Case("tokens_full").tokens(TokenRule::full),
      Case("tokens_128").max_tokens(128).top_k(4).experts_per_rank(16).hidden(40),
      // The small-batch dispatch kernel's bound (one routing round of 512).
      Case("tokens_512").max_tokens(512).top_k(8).experts_per_rank(16).hidden(40),
      Case("max_tokens_1").max_tokens(1),
      // runtime_max_tokens_per_rank below max_tokens_per_rank.
      Case("runtime_max_5").max_tokens(32).runtime_max(5),
      Case("runtime_max_1").runtime_max(1).tokens(TokenRule::full),
      // Masked picks, invalid ids, bad ids (dropped and reported).
      Case("masked_30pct").top_k(4).mask(0.3),
      Case("masked_all").mask(1.0).tokens(TokenRule::full),
      Case("invalid_id_minus_7").invalid_id(-7).mask(0.25),
      Case("invalid_id_above_E").invalid_id_above_experts().mask(0.25),
      Case("bad_ids_dropped").top_k(3).bad_ids(0.1).tokens(TokenRule::full),
      // Weights off; eplb statistics counted by the library or given.
      Case("no_weights").no_weights(),
      Case("eplb_counted").eplb(false).mask(0.2),
      Case("eplb_given").eplb(true),
      // The routing shapes the benchmark uses.
      Case("routing_balanced").routing(RoutingKind::balanced).top_k(4).experts_per_rank(8).tokens(TokenRule::full),
      Case("routing_zipf").routing(RoutingKind::zipf, 1.5).top_k(4).experts_per_rank(8),
      // Zero-copy combine input: the expert output written into the dispatch
      // result's combine_input view and passed back as expert_output.
      Case("zero_copy_input").zero_copy_combine().hidden(96).top_k(3).runtime_max(12),
      Case("zero_copy_fp32").zero_copy_combine().hidden(33).dtypes("bf16", "fp32").tokens(TokenRule::unequal),
      // The expert layouts' own knobs (run in EXPERT_MAJOR and EXPERT_PACKED only):
      // a capacity that drops pairs, GEMM-tile alignments, a bound below the
      // worst case, pre-weighted expert output, TMA-aligned column-major scales.
      Case("expert_capacity_3").expert_capacity(3).top_k(4).routing(RoutingKind::zipf, 1.5).tokens(TokenRule::full),
      Case("expert_align_128").expert_alignment(128).top_k(3),
      Case("expert_align_256").expert_alignment(256).max_tokens(8),
      Case("expert_rows_bound")
          .expert_alignment(8, 24)
          .top_k(4)
          .routing(RoutingKind::zipf, 1.5)
          .tokens(TokenRule::full),
      Case("expert_weighted").expert_output_weighted().top_k(3),
      Case("fp8_scales_column").hidden(512).dtypes("fp8_e4m3", "bf16").scales(4, "fp32").column_major_scales().top_k(4),
  };
}

std::vector<int> parse_layouts(const std::string& name) {
  if (name == "all") return {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED};
  for (int layout : {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    if (name == layout_name(layout)) return {layout};
  }
  fail("--layouts must be rank_major, expert_major, expert_packed or all, got '" + name + "'");
}

const char* layout_name(int layout) {
  switch (layout) {
    case MOE_EP_LAYOUT_RANK_MAJOR: return "rank_major";
    case MOE_EP_LAYOUT_EXPERT_MAJOR: return "expert_major";
    case MOE_EP_LAYOUT_EXPERT_PACKED: return "expert_packed";
  }
  return "?";
}

std::vector<int> parse_wires(const std::string& name) {
  if (name == "as_is") return {MOE_EP_WIRE_AS_IS};
  if (name == "fp8") return {MOE_EP_WIRE_FP8_E4M3_BLOCK128};
  if (name == "fp8_dispatch") return {kWireFp8DispatchOnly};
  if (name == "fp8_dequantize") return {kWireFp8Dequantize};
  if (name == "all") return {MOE_EP_WIRE_AS_IS, MOE_EP_WIRE_FP8_E4M3_BLOCK128};
  fail("--wire must be as_is, fp8, fp8_dispatch, fp8_dequantize or all, got '" + name + "'");
}

int parse_wire_scale(const std::string& name) {
  if (name == "fp32") return MOE_EP_WIRE_SCALE_FP32;
  if (name == "ue8m0") return MOE_EP_WIRE_SCALE_UE8M0;
  fail("--wire-scale must be fp32 or ue8m0, got '" + name + "'");
}

WorkloadSpec instantiate(const CheckCase& c, int world, uint64_t seed, uint64_t count_seed) {
  WorkloadSpec s = c.shape;
  s.world = world;
  s.seed = seed;
  s.num_experts = c.experts_per_rank * world;
  if (s.num_experts < c.min_experts) s.num_experts = (c.min_experts + world - 1) / world * world;
  if (c.top_k_is_all) s.top_k = s.num_experts;
  s.top_k = std::min(s.top_k, s.num_experts);
  if (c.invalid_above) s.invalid_expert_id = s.num_experts + 5;
  s.receive_layout = c.layout;
  if (c.layout == MOE_EP_LAYOUT_EXPERT_MAJOR) s.expert_capacity = c.expert_capacity;
  if (c.layout == MOE_EP_LAYOUT_EXPERT_PACKED) {
    s.expert_alignment = c.expert_alignment;
    s.expert_rows = c.expert_rows;
  }
  if (c.layout != MOE_EP_LAYOUT_RANK_MAJOR) {
    s.expert_output_weighted = c.expert_output_weighted;
    s.scale_layout = c.column_major_scales ? MOE_EP_SCALES_COLUMN_MAJOR : MOE_EP_SCALES_ROW_MAJOR;
  }
  if (c.wire != MOE_EP_WIRE_AS_IS) {
    s.wire_scale = c.wire_scale;
    if (c.wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128) s.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    if (is_float_dtype(s.hidden_dtype) && s.scale_row_elems == 0) s.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    if (s.dispatch_wire != MOE_EP_WIRE_AS_IS && c.wire == kWireFp8Dequantize) {
      s.dispatch_dequantize = true;
      s.scale_layout = MOE_EP_SCALES_ROW_MAJOR;  // dequantized rows have no scales
    }
  }
  const int tpr = s.tokens_per_rank();
  s.tokens.resize(world);
  for (int r = 0; r < world; ++r) {
    switch (c.tokens) {
      case TokenRule::random: s.tokens[r] = int(draw(count_seed, uint64_t(r)) % uint64_t(tpr + 1)); break;
      case TokenRule::full: s.tokens[r] = tpr; break;
      case TokenRule::zero: s.tokens[r] = 0; break;
      case TokenRule::rank0_zero: s.tokens[r] = r == 0 ? 0 : tpr; break;
      case TokenRule::unequal: s.tokens[r] = (5 * r + 3) % (tpr + 1); break;
    }
  }
  return s;
}

}  // namespace moe_ep_tool
