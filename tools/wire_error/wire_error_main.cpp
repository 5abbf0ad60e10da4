// moe_ep_wire_error: the error of the FP8 wire (MOE_EP_WIRE_FP8_E4M3_BLOCK128)
// against AS_IS, measured through the public API on the HOST backend (whose
// bits every backend reproduces): the same inputs dispatched and combined by
// an AS_IS handle and by an FP8 handle (both wires FP8, dispatch_dequantize
// on), rows compared.  The ranks are threads of this process.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "activations.hpp"
#include "error_stats.hpp"
#include "moe_ep_c.h"
#include "thread_group.hpp"

namespace moe_ep_wire_error {
namespace {

struct Options {
  int32_t ranks = 8, tokens = 128, hidden = 7168, experts = 256, topk = 8;
  uint64_t seed = 1;
  bool assert_bounds = false;
};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "moe_ep_wire_error: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

void check(moe_ep_status_t s, const char* call) {
  if (s != MOE_EP_SUCCESS) fail(std::string(call) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error());
}

int64_t parse_int(const char* name, const char* text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < lo || v > hi) {
    fail(std::string(name) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
         "], got '" + text + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: moe_ep_wire_error [--ranks N] [--tokens T] [--hidden H] [--experts E] [--topk K] [--seed S]"
          " [--assert]\n"
          "The FP8 wire's error against AS_IS on the HOST backend (ranks are threads): dispatched rows and\n"
          "combine outputs, per element (relative, nonzero references) and per row (relative norm).\n"
          "Defaults: 8 ranks, 128 tokens per rank, the DeepSeek shape (hidden 7168, top-8 of 256 experts).\n"
          "--assert: exit 1 unless every figure is above 0 (the wire quantized) and every received row is\n"
          "within the bound of docs/semantics.md (2^-4 relative, plus 2^-8 for the subnormal range and bf16).\n");
      std::exit(0);
    }
    if (a == "--assert") {
      o.assert_bounds = true;
      continue;
    }
    if (i + 1 >= argc) fail(a + ": expected a value, or an unknown option");
    const char* v = argv[++i];
    if (a == "--ranks")
      o.ranks = static_cast<int32_t>(parse_int("--ranks", v, 1, 64));
    else if (a == "--tokens")
      o.tokens = static_cast<int32_t>(parse_int("--tokens", v, 1, 1 << 16));
    else if (a == "--hidden")
      o.hidden = static_cast<int32_t>(parse_int("--hidden", v, 1, 1 << 16));
    else if (a == "--experts")
      o.experts = static_cast<int32_t>(parse_int("--experts", v, 1, 1 << 14));
    else if (a == "--topk")
      o.topk = static_cast<int32_t>(parse_int("--topk", v, 1, 1 << 10));
    else if (a == "--seed")
      o.seed = static_cast<uint64_t>(parse_int("--seed", v, 0, INT64_MAX));
    else
      fail("unknown option '" + a + "'");
  }
  if (o.experts % o.ranks != 0) {
    fail("--experts: expected a multiple of --ranks (" + std::to_string(o.ranks) + "), got " +
         std::to_string(o.experts));
  }
  if (o.topk > o.experts) fail("--topk: expected at most --experts, got " + std::to_string(o.topk));
  return o;
}

moe_ep_tensor_t cpu_tensor(void* data, moe_ep_dtype_t dtype, int64_t* shape, int32_t ndim) {
  moe_ep_tensor_t t{};
  t.data = data;
  t.device = {MOE_EP_DEVICE_CPU, 0};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

constexpr moe_ep_dtype_t kBf16{MOE_EP_DTYPE_BFLOAT, 16, 1};
constexpr moe_ep_dtype_t kInt32{MOE_EP_DTYPE_INT, 32, 1};
constexpr moe_ep_dtype_t kFp32{MOE_EP_DTYPE_FLOAT, 32, 1};

// One rank's inputs: rows, distinct picks and weights that sum to 1.
struct RankInputs {
  std::vector<uint16_t> hidden;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

RankInputs make_inputs(const Options& o, const Activations& act, int32_t rank) {
  RankInputs in;
  std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(rank));
  in.hidden.resize(static_cast<size_t>(o.tokens) * o.hidden);
  in.ids.resize(static_cast<size_t>(o.tokens) * o.topk);
  in.weights.resize(in.ids.size());
  std::vector<int32_t> experts(static_cast<size_t>(o.experts));
  std::iota(experts.begin(), experts.end(), 0);
  std::uniform_real_distribution<float> uniform(0.05f, 1.0f);
  for (int32_t t = 0; t < o.tokens; ++t) {
    act.row(rng, in.hidden.data() + static_cast<size_t>(t) * o.hidden);
    float sum = 0;
    for (int32_t k = 0; k < o.topk; ++k) {
      std::swap(experts[static_cast<size_t>(k)],
                experts[static_cast<size_t>(std::uniform_int_distribution<int32_t>(k, o.experts - 1)(rng))]);
      const size_t at = static_cast<size_t>(t) * o.topk + k;
      in.ids[at] = experts[static_cast<size_t>(k)];
      sum += in.weights[at] = uniform(rng);
    }
    for (int32_t k = 0; k < o.topk; ++k) in.weights[static_cast<size_t>(t) * o.topk + k] /= sum;
  }
  return in;
}

moe_ep_handle_t create(const Options& o, const moe_ep_bootstrap_t& b, bool fp8, int32_t scale_rule) {
  moe_ep_params_t p;
  check(moe_ep_params_init(&p, sizeof(p)), "moe_ep_params_init");
  p.num_experts = o.experts;
  p.top_k = o.topk;
  p.max_tokens_per_rank = o.tokens;
  p.hidden_size = o.hidden;
  if (fp8) {
    p.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    p.wire_scale = scale_rule;
    p.dispatch_dequantize = 1;
  }
  moe_ep_config_t c;
  check(moe_ep_config_init(&c, sizeof(c)), "moe_ep_config_init");
  c.backend = MOE_EP_BACKEND_HOST;
  moe_ep_handle_t h = nullptr;
  check(moe_ep_create(&b, &p, &c, &h), "moe_ep_create");
  return h;
}

// What one handle gives back on one rank: the received rows (valid ones
// only, rank-major) and the combine output, both as fp32.
struct RankOutputs {
  std::vector<float> received, combined;
};

RankOutputs run_handle(const Options& o, moe_ep_handle_t h, RankInputs& in, const Activations& expert_act,
                       int32_t rank) {
  int64_t hidden_shape[2] = {o.tokens, o.hidden}, pick_shape[2] = {o.tokens, o.topk};
  const moe_ep_tensor_t hidden = cpu_tensor(in.hidden.data(), kBf16, hidden_shape, 2);
  const moe_ep_tensor_t ids = cpu_tensor(in.ids.data(), kInt32, pick_shape, 2);
  const moe_ep_tensor_t weights = cpu_tensor(in.weights.data(), kFp32, pick_shape, 2);
  moe_ep_dispatch_args_t args;
  check(moe_ep_dispatch_args_init(&args, sizeof(args)), "moe_ep_dispatch_args_init");
  args.hidden_states = &hidden;
  args.topk_ids = &ids;
  args.topk_weights = &weights;
  moe_ep_dispatch_result_t r;
  check(moe_ep_dispatch_result_init(&r, sizeof(r)), "moe_ep_dispatch_result_init");
  check(moe_ep_dispatch(h, &args, &r, nullptr), "moe_ep_dispatch");

  RankOutputs out;
  const int64_t tpr = r.tokens_per_rank, rows = o.ranks * tpr;
  const auto* counts = static_cast<const int32_t*>(r.recv_counts.data);
  const auto* recv = static_cast<const uint16_t*>(r.hidden_states.data);
  out.received.reserve(static_cast<size_t>(rows) * o.hidden);
  out.combined.reserve(static_cast<size_t>(o.tokens) * o.hidden);
  for (int32_t s = 0; s < o.ranks; ++s) {
    for (int64_t j = 0; j < counts[s]; ++j) {
      const uint16_t* row = recv + (s * tpr + j) * o.hidden;
      for (int32_t c = 0; c < o.hidden; ++c) out.received.push_back(bf16_to_float(row[c]));
    }
  }
  // The experts' outputs: the same rows on every handle (same seed).
  std::vector<uint16_t> expert_output(static_cast<size_t>(rows) * o.hidden);
  std::mt19937_64 rng(o.seed * 104729 + static_cast<uint64_t>(rank));
  for (int64_t i = 0; i < rows; ++i) expert_act.row(rng, expert_output.data() + i * o.hidden);
  int64_t expert_shape[2] = {rows, o.hidden};
  const moe_ep_tensor_t expert = cpu_tensor(expert_output.data(), kBf16, expert_shape, 2);
  moe_ep_combine_result_t cr;
  check(moe_ep_combine_result_init(&cr, sizeof(cr)), "moe_ep_combine_result_init");
  check(moe_ep_combine(h, &expert, nullptr, &cr, nullptr), "moe_ep_combine");
  const auto* combined = static_cast<const uint16_t*>(cr.output.data);
  for (int64_t i = 0; i < int64_t{o.tokens} * o.hidden; ++i) out.combined.push_back(bf16_to_float(combined[i]));
  return out;
}

struct CaseErrors {
  ErrorStats dispatch, combine;
};

CaseErrors run_case(const Options& o, const ActivationModel& model, int32_t scale_rule) {
  const Activations act(model, o.hidden, o.seed), expert_act(model, o.hidden, o.seed + 1);
  CaseErrors errors;
  std::mutex merge;
  ThreadGroup group(o.ranks);
  group.run([&](int32_t rank, const moe_ep_bootstrap_t& b) {
    RankInputs in = make_inputs(o, act, rank);
    moe_ep_handle_t as_is = create(o, b, false, scale_rule);
    moe_ep_handle_t fp8 = create(o, b, true, scale_rule);
    const RankOutputs want = run_handle(o, as_is, in, expert_act, rank);
    const RankOutputs got = run_handle(o, fp8, in, expert_act, rank);
    check(moe_ep_destroy(&fp8), "moe_ep_destroy");
    check(moe_ep_destroy(&as_is), "moe_ep_destroy");
    if (got.received.size() != want.received.size()) fail("the two handles received different row counts");
    CaseErrors mine;
    for (size_t at = 0; at < want.received.size(); at += static_cast<size_t>(o.hidden)) {
      mine.dispatch.add_row(got.received.data() + at, want.received.data() + at, o.hidden);
    }
    for (size_t at = 0; at < want.combined.size(); at += static_cast<size_t>(o.hidden)) {
      mine.combine.add_row(got.combined.data() + at, want.combined.data() + at, o.hidden);
    }
    std::lock_guard<std::mutex> lock(merge);
    errors.dispatch.merge(mine.dispatch);
    errors.combine.merge(mine.combine);
  });
  return errors;
}

}  // namespace
}  // namespace moe_ep_wire_error

int main(int argc, char** argv) {
  using namespace moe_ep_wire_error;
  const Options o = parse(argc, argv);
  std::printf(
      "# moe_ep_wire_error: FP8_E4M3_BLOCK128 against AS_IS, HOST backend, %d ranks x %d tokens, hidden %d, "
      "top-%d of %d experts, bf16 rows, seed %llu\n",
      o.ranks, o.tokens, o.hidden, o.topk, o.experts, static_cast<unsigned long long>(o.seed));
  const ActivationModel realistic;
  std::printf(
      "# activations: gaussian = N(0,1); realistic = N(0,1) x a per-token lognormal scale (sigma %.1f), "
      "%d channels x%.0f, %.1g of elements x%.0f (the experts' outputs drawn the same way)\n",
      realistic.token_sigma, realistic.massive_channels, realistic.massive_gain, realistic.outlier_rate,
      realistic.outlier_gain);
  std::printf("# element: |fp8 - as_is| / |as_is| over nonzero as_is elements; row: ||fp8 - as_is|| / ||as_is||\n");
  std::printf("# dispatch: the received rows (dispatch_dequantize); combine: the outputs (both wires FP8)\n#\n");
  std::printf("# %-11s %-6s | %-45s | %-45s\n", "activations", "scale", "dispatch: element mean / max, row mean / max",
              "combine: element mean / max, row mean / max");
  // A received row: each element within 2^-4 relative in e4m3's normal
  // range, the subnormal range's absolute error far below the row's norm,
  // and bf16's rounding: 2^-4 + 2^-8 bounds the row's relative norm.
  const double row_bound = 1.0 / 16 + 1.0 / 256;
  int failures = 0;
  for (const bool real : {false, true}) {
    ActivationModel model;
    model.realistic = real;
    for (const int32_t rule : {MOE_EP_WIRE_SCALE_FP32, MOE_EP_WIRE_SCALE_UE8M0}) {
      const CaseErrors e = run_case(o, model, rule);
      std::printf("  %-11s %-6s | %9.3e %9.3e %9.3e %9.3e       | %9.3e %9.3e %9.3e %9.3e\n",
                  real ? "realistic" : "gaussian", rule == MOE_EP_WIRE_SCALE_FP32 ? "fp32" : "ue8m0",
                  e.dispatch.element_mean(), e.dispatch.element_max, e.dispatch.row_mean(), e.dispatch.row_max,
                  e.combine.element_mean(), e.combine.element_max, e.combine.row_mean(), e.combine.row_max);
      const bool quantized = e.dispatch.element_max > 0 && e.combine.element_max > 0;
      if (o.assert_bounds && (!quantized || e.dispatch.row_max > row_bound)) {
        std::printf("  FAILED: %s (bound %.4f)\n", quantized ? "a received row beyond the bound" : "an error of 0",
                    row_bound);
        ++failures;
      }
    }
  }
  return failures == 0 ? 0 : 1;
}
