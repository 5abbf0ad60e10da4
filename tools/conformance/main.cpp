// moe_ep_conformance: checks that moe_ep works on this machine (`check`) and
// measures how fast it is next to the copy-engine ceiling and NCCL (`bench`).
// Launched with mpirun, one process per GPU (or per CPU rank on the host
// backend).  Flags follow nccl-tests and the OSU benchmarks where they can.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "bench_command.hpp"
#include "check.hpp"
#include "errors.hpp"
#include "mpi_world.hpp"
#include "session.hpp"

namespace {

using moe_ep_tool::BenchOptions;
using moe_ep_tool::CheckOptions;
using moe_ep_tool::CommonOptions;

// Exit code of every bad argument, on every rank: argv is the same on every
// rank, so each decides alone, before any collective.
constexpr int kBadArgument = 2;

std::string range_text(long long lo, long long hi) {
  if (hi == LLONG_MAX || hi == INT_MAX) return ">= " + std::to_string(lo);
  return "from " + std::to_string(lo) + " to " + std::to_string(hi);
}

// Validators whose failure reads "--flag: expected ..., got '...'" (CLI11
// prefixes the flag), one line, instead of CLI11's ranges over the whole type.
CLI::Validator integer_in(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0' && errno == 0 && v >= lo && v <= hi) return std::string();
        return "expected an integer " + range_text(lo, hi) + ", got '" + text + "'";
      },
      // What --help shows after the type, in CLI11's own words.
      lo == 1 && hi == INT_MAX   ? "POSITIVE"
      : lo == 0 && hi == INT_MAX ? "NONNEGATIVE"
                                 : "[" + std::to_string(lo) + " - " + std::to_string(hi) + "]");
}
CLI::Validator integer_at_least(long long lo) { return integer_in(lo, INT_MAX); }

// "auto" (stored as moe_ep_tool::kExpertRowsAuto) or an integer >= 0.
CLI::Validator auto_or_count() {
  const CLI::Validator count = integer_at_least(0);
  return CLI::Validator(
      [count](std::string& text) -> std::string {
        if (text == "auto") {
          text = std::to_string(moe_ep_tool::kExpertRowsAuto);
          return std::string();
        }
        std::string copy = text;
        return count(copy).empty() ? std::string() : "expected auto or an integer >= 0, got '" + text + "'";
      },
      "auto|NONNEGATIVE");
}

CLI::Validator real_in(double lo, double hi, bool lo_open) {
  const std::string expected = std::string("a number ") + (lo_open ? "> " : ">= ") + std::to_string(lo).substr(0, 3) +
                               (std::isinf(hi) ? std::string() : " and <= " + std::to_string(hi).substr(0, 3));
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool ok =
            !text.empty() && *end == '\0' && errno == 0 && std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
        return ok ? std::string() : "expected " + expected + ", got '" + text + "'";
      },
      expected);
}

void add_common(CLI::App* app, CommonOptions& o) {
  std::string names;
  for (const std::string& n : moe_ep_tool::backend_names()) names += (names.empty() ? "" : " | ") + n;
  app->add_option("--backend", o.backend,
                  names +
                      " (auto: NVLINK_TWO_SIDED when every rank is in one NVLink domain, else NCCL when it loads and "
                      "tensors are on GPUs, else HOST)")
      ->check(CLI::IsMember(moe_ep_tool::backend_names()));
  app->add_option("--num-sms", o.num_sms, "SMs the kernels may use (0 = the library chooses)")
      ->check(integer_in(0, 4096));
  app->add_option("--timeout-ms", o.timeout_ms,
                  "bound on every wait for a peer (config.timeout_ms); the tool's own collectives give up "
                  "5000 ms after it and abort the job with a message")
      ->check(integer_in(1, 86400000));
  app->add_option("--seed", o.seed, "seed of every random input");
}

void add_check(CLI::App& app, CheckOptions& o) {
  CLI::App* check = app.add_subcommand("check", "compare every case of the matrix with the oracle (moe_ep_verify)");
  add_common(check, o.common);
  check->add_option("--rounds", o.rounds, "eager dispatch/combine pairs per case, fresh inputs each")
      ->check(integer_in(1, 1000));
  check->add_option("--filter", o.filter, "run only the cases whose name contains this (at least one must)");
  check->add_option("--modes", o.modes, "eager | graph | both | auto (both on GPU, eager on host)")
      ->check(CLI::IsMember({"eager", "graph", "both", "auto"}));
  check
      ->add_option("--phases", o.phases,
                   "fused | split | both: the fused calls, or the split halves with two micro-batches in flight "
                   "(backends without halves: those cases are skipped, and the tool says so)")
      ->check(CLI::IsMember({"fused", "split", "both"}));
  check
      ->add_option("--layouts", o.layouts,
                   "rank_major | expert_major | expert_packed | all: the receive layouts every case runs in "
                   "(a backend without one: those runs are skipped, with the library's reason)")
      ->check(CLI::IsMember({"rank_major", "expert_major", "expert_packed", "all"}));
  check
      ->add_option("--wire", o.wires,
                   "as_is | fp8 | fp8_dispatch | fp8_dequantize | all: the wire formats every case runs with (fp8: "
                   "an FP8 combine wire, and an FP8 dispatch wire where the rows are bf16, fp16 or fp32; "
                   "fp8_dispatch: that dispatch wire only; fp8_dequantize: that dispatch wire, rows dequantized "
                   "on receipt; a backend without it: those runs are skipped)")
      ->check(CLI::IsMember({"as_is", "fp8", "fp8_dispatch", "fp8_dequantize", "all"}));
  check
      ->add_option("--wire-scale", o.wire_scale,
                   "params->wire_scale of the FP8 wires every case runs with: fp32 (amax / 448) | ue8m0 (the "
                   "power of two at or above it)")
      ->check(CLI::IsMember({"fp32", "ue8m0"}));
  check
      ->add_option("--inactive-ranks", o.inactive_ranks,
                   "comma-separated ranks made inactive (moe_ep_set_active_ranks) on every handle after create (in "
                   "graph mode between the two replays of a graph captured before): "
                   "every result is then compared with the oracle on the routing with their experts and their "
                   "tokens masked (a backend without masks: those runs are skipped)")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  check->add_flag("!--no-poison-results", o.poison_results,
                  "do not overwrite dispatch payload results before combine");
  check->add_flag("--list", o.list, "print the case names and exit");
  check->add_flag("--zero-copy-combine", o.zero_copy_combine,
                  "run every case with config.zero_copy_combine, the expert output written into the combine_input "
                  "view (on NCCL: the path with buffers registered with NCCL)");
  check
      ->add_option("--inject-fault", o.inject_fault,
                   "self-test: corrupt rank 0's copy of a result before the comparison, which must then fail")
      ->check(CLI::IsMember(
          {"none", "dispatch_payload", "dispatch_order", "recv_counts", "combine_output", "stalled_rank"}));
}

CLI::App* add_bench(CLI::App& app, BenchOptions& o) {
  CLI::App* bench = app.add_subcommand("bench", "time dispatch and combine over a sweep of tokens per rank");
  add_common(bench, o.common);
  bench->add_option("-b,--min-tokens", o.min_tokens, "smallest tokens per rank")->check(integer_at_least(1));
  bench->add_option("-e,--max-tokens", o.max_tokens, "largest tokens per rank")->check(integer_at_least(1));
  bench->add_option("-f,--step-factor", o.step_factor, "multiply tokens per rank by this between sizes")
      ->check(integer_in(2, 1 << 20));
  bench
      ->add_option("-t,--tokens", o.token_list, "explicit comma-separated list of tokens per rank (overrides -b/-e/-f)")
      ->delimiter(',')
      ->check(integer_at_least(1));
  bench->add_option("--hidden", o.hidden, "hidden size (elements per row)")->check(integer_at_least(1));
  bench->add_option("--topk", o.top_k, "experts per token")->check(integer_at_least(1));
  bench->add_option("--experts", o.experts, "number of experts (a multiple of the ranks)")->check(integer_at_least(1));
  bench->add_option("--dtype", o.dtype, "dispatch payload: bf16 | fp16 | fp32 | fp8 (fp8 adds fp32 scales, 1 per 128)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32", "fp8"}));
  bench->add_option("--combine-dtype", o.combine_dtype, "bf16 | fp16 | fp32 (default: --dtype, bf16 for fp8)")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  bench->add_option("--routing", o.routing, "uniform | balanced | zipf")
      ->check(CLI::IsMember({"uniform", "balanced", "zipf"}));
  bench->add_option("--zipf-s", o.zipf_s, "zipf exponent: expert e drawn with weight 1/(e+1)^s")
      ->check(real_in(0.0, HUGE_VAL, true));
  bench->add_option("--mask", o.mask_fraction, "fraction of picks set to invalid_expert_id")
      ->check(real_in(0.0, 1.0, false));
  bench->add_option("-w,--warmup-iters", o.warmup, "untimed iterations per size")->check(integer_at_least(0));
  bench->add_option("-n,--iters", o.iters, "timed iterations per size")->check(integer_at_least(1));
  bench->add_option("-c,--check", o.check, "1 = count #wrong once per size before timing, 0 = skip")
      ->check(integer_in(0, 1));
  bench->add_flag("-G,--graph", o.graph, "time CUDA-graph replays of dispatch and of combine (GPU)");
  bench->add_flag("!--no-baselines", o.baselines, "skip the ceiling and NCCL baselines");
  bench->add_flag("--zero-copy-combine", o.zero_copy_combine,
                  "create with config.zero_copy_combine: the expert output is written into the dispatch result's "
                  "combine_input view (outside the timed loop) and the timed combine takes that view");
  bench->add_flag("!--no-launch-gate", o.launch_gate,
                  "GPU: do not queue launches ahead of the GPU; times then include the host's launch cost");
  bench->add_flag("--decode-step", o.decode_step,
                  "instead of the sweep: dispatch -> a stand-in expert kernel -> combine, one CUDA graph per step with "
                  "-G, timed against its parts (default sizes 1,8,32,128)");
  bench->add_flag("--overlap-gemm", o.overlap_gemm,
                  "instead of the sweep: dispatch and combine (--num-sms) beside a cuBLAS bf16 GEMM on the other SMs, "
                  "each against itself alone (GPU; default size 4096)");
  bench->add_flag("--micro-batch-overlap", o.micro_batch_overlap,
                  "instead of the sweep: a step of two micro-batches of T/2 tokens (config.micro_batches = 2), each "
                  "dispatch -> expert GEMMs -> combine, one's halves around the other's GEMMs, against the fused "
                  "calls in sequence, communication alone and compute alone (default sizes 256,4096; even sizes)");
  bench
      ->add_option("--expert-intermediate", o.expert_intermediate,
                   "--micro-batch-overlap: the experts' intermediate size I (GEMMs M x 2I x hidden and M x hidden x "
                   "I; DeepSeek-V3: 2048)")
      ->check(integer_in(1, 1 << 17));
  bench
      ->add_option("--expert-rows", o.expert_rows,
                   "--micro-batch-overlap: the GEMMs' M, picks (each received row once per local expert it goes to: "
                   "a grouped GEMM over this rank's experts) | rows (each received row once)")
      ->check(CLI::IsMember({"picks", "rows"}));
  bench
      ->add_option("--layout", o.layout,
                   "the sweep's receive layout: rank_major | expert_major | expert_packed | rank_major+user "
                   "(RANK_MAJOR with the reference permute and un-permute/reduce kernels a user would write, GPU) | "
                   "all (the four, then a table of them side by side)")
      ->check(CLI::IsMember({"rank_major", "expert_major", "expert_packed", "rank_major+user", "all"}));
  bench
      ->add_option("--wire", o.wire,
                   "the sweep's wire format: as_is | fp8 (dispatch_wire and combine_wire FP8_E4M3_BLOCK128) | "
                   "fp8_dispatch (dispatch_wire only) | quantize+as_is (a reference quantize kernel, then an AS_IS "
                   "dispatch of the e4m3 rows and fp32 scales; GPU) | all (the four, then a table of them side by "
                   "side); bytes counted as they cross")
      ->check(CLI::IsMember({"as_is", "fp8", "fp8_dispatch", "quantize+as_is", "all"}));
  bench->add_option("--wire-scale", o.wire_scale, "params->wire_scale of an FP8 wire: fp32 | ue8m0")
      ->check(CLI::IsMember({"fp32", "ue8m0"}));
  bench->add_flag("--dispatch-dequantize", o.dispatch_dequantize,
                  "params->dispatch_dequantize with an FP8 dispatch wire (rows arrive dequantized to --dtype)");
  bench
      ->add_option("--expert-alignment", o.expert_alignment,
                   "params->expert_alignment of EXPERT_PACKED, and the reference kernels' alignment (0 = 1)")
      ->check(integer_in(0, 256));
  bench
      ->add_option("--expert-capacity", o.expert_capacity,
                   "params->expert_capacity of EXPERT_MAJOR, rows per expert: auto (what a server sizes from its "
                   "routing: the most rows any expert receives in the bench's routing over its sizes, rounded up to "
                   "--expert-alignment, or 128 without one) | 0 (the worst case, world x max tokens) | N")
      ->transform(auto_or_count())
      ->default_str("auto");
  bench
      ->add_option("--expert-packed-rows", o.expert_packed_rows,
                   "params->expert_rows of EXPERT_PACKED, rows of the result: auto (the most rows one rank fills in "
                   "the bench's routing over its sizes, each expert's rounded up to the alignment) | 0 (the worst "
                   "case) | N")
      ->transform(auto_or_count())
      ->default_str("auto");
  bench
      ->add_option("--expert-gemm", o.expert_gemm,
                   "--decode-step and --micro-batch-overlap: the expert, stand_in (the copy kernel; one GEMM per "
                   "projection on random operands) | grouped (cuBLAS grouped GEMMs, one per local expert, on the "
                   "EXPERT_PACKED rows of dispatch, no permute; GPU, bf16)")
      ->check(CLI::IsMember({"stand_in", "grouped"}));
  bench->add_flag("--no-sm-held", o.no_sm_held,
                  "instead of the sweep: a GEMM on every SM between a send half and its receive half, against the "
                  "same GEMM alone (GPU; default sizes 128,4096)");
  bench
      ->add_option("--gemm-mnk", o.gemm_mnk,
                   "the GEMM's M,N,K: --overlap-gemm (default: N = K = 8192, M sized to "
                   "take about as long as dispatch + combine) and --no-sm-held (default 8192,8192,8192)")
      ->delimiter(',')
      ->expected(3)
      ->check(integer_in(1, 1 << 17));
  bench->add_option("-J,--json", o.json_path, "write every figure, the byte formulas and the machine to this file");
  return bench;
}

}  // namespace

// Relations between flags that CLI11's per-flag checks cannot see; "" if none.
std::string bad_combination(const CLI::App* bench_app, const BenchOptions& o) {
  if (bench_app->parsed() && o.token_list.empty() && o.min_tokens > o.max_tokens) {
    return "-b/--min-tokens: expected at most -e/--max-tokens (" + std::to_string(o.max_tokens) + "), got " +
           std::to_string(o.min_tokens);
  }
  if (!bench_app->parsed()) return std::string();
  if (o.micro_batch_overlap) {
    for (int t : moe_ep_tool::micro_batch_sizes(o)) {
      if (t < 2 || t % 2 != 0) {
        return "--micro-batch-overlap: each size is split into two micro-batches of T/2 tokens per rank: expected "
               "even sizes >= 2, got " +
               std::to_string(t);
      }
    }
  }
  if (o.special_mode() && o.layout != "rank_major") {
    return "--layout: expected rank_major (the default) with --decode-step, --overlap-gemm, --micro-batch-overlap "
           "and --no-sm-held (--expert-gemm grouped runs them in EXPERT_PACKED), got " +
           o.layout;
  }
  if (o.special_mode() && o.wire != "as_is") {
    return "--wire: expected as_is (the default) with --decode-step, --overlap-gemm, --micro-batch-overlap and "
           "--no-sm-held, got " +
           o.wire;
  }
  if (o.wire == "all" && o.layout == "all") {
    return "--wire all: expected one --layout with it (each table side by side varies one of them), got --layout all";
  }
  if (o.wire != "as_is" && o.dtype == "fp8") {
    return "--wire " + o.wire + ": expected --dtype bf16, fp16 or fp32 (the rows the wire quantizes), got fp8";
  }
  if (o.expert_gemm == "grouped" && !o.decode_step && !o.micro_batch_overlap) {
    return "--expert-gemm grouped: expected with --decode-step or --micro-batch-overlap, got neither";
  }
  if (o.expert_gemm == "grouped" && o.expert_rows == "rows") {
    return "--expert-rows rows: expected picks with --expert-gemm grouped (one row per local pick), got rows";
  }
  if (o.zero_copy_combine && (o.micro_batch_overlap || o.no_sm_held)) {
    return std::string("--zero-copy-combine: expected without ") +
           (o.micro_batch_overlap ? "--micro-batch-overlap" : "--no-sm-held") +
           " (its combine takes the tool's expert output), got both";
  }
  return std::string();
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  moe_ep_tool::World world = moe_ep_tool::World::from_comm(MPI_COMM_WORLD);
  CLI::App app{"moe_ep_conformance: conformance check and benchmark of moe_ep, launched with mpirun"};
  app.option_defaults()->always_capture_default();  // --help shows every default (subcommands inherit this)
  app.require_subcommand(1);
  CheckOptions check;
  BenchOptions bench;
  add_check(app, check);
  CLI::App* bench_app = add_bench(app, bench);
  try {
    app.parse(argc, argv);
    bench.sizes_given =
        bench_app->count("-t") + bench_app->count("-b") + bench_app->count("-e") + bench_app->count("-f") > 0;
  } catch (const CLI::ParseError& e) {
    // --help (exit code 0) prints the help; any other error one line, and
    // the same exit code on every rank.
    const bool help = e.get_exit_code() == 0;
    if (world.is_root()) {
      if (help) {
        app.exit(e);
      } else {
        std::fprintf(stderr, "moe_ep_conformance: %s (see --help)\n", e.what());
      }
    }
    MPI_Finalize();
    return help ? 0 : kBadArgument;
  }
  const std::string bad = bad_combination(bench_app, bench);
  if (!bad.empty()) {
    if (world.is_root()) std::fprintf(stderr, "moe_ep_conformance: %s (see --help)\n", bad.c_str());
    MPI_Finalize();
    return kBadArgument;
  }
  world.timeout_ms = app.got_subcommand("check") ? check.common.timeout_ms : bench.common.timeout_ms;
  world.set_phase(app.got_subcommand("check") ? "check" : "bench");
  int rc = 0;
  try {
    rc = app.got_subcommand("check") ? moe_ep_tool::run_check(world, check) : moe_ep_tool::run_bench(world, bench);
  } catch (const std::exception& e) {
    // One rank failing alone would leave the others waiting in a collective.
    std::fprintf(stderr, "moe_ep_conformance: rank %d: %s\n", world.rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Finalize();
  return rc;
}
