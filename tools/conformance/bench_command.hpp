// `moe_ep_conformance bench`: sweeps tokens per rank and reports dispatch and
// combine latency and bandwidth next to the peer-copy ceiling and NCCL moving
// the same routing, in an nccl-tests-like table (and JSON with --json).
// --decode-step (decode_step.hpp), --overlap-gemm (gemm_overlap.hpp),
// --micro-batch-overlap (micro_batch_overlap.hpp) and --no-sm-held
// (no_sm_held.hpp) measure, instead of the sweep, a decode step,
// dispatch/combine beside a GEMM, a step of two overlapped micro-batches, and
// a GEMM between the split halves.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "decode_step.hpp"
#include "gemm_overlap.hpp"
#include "loop_timer.hpp"
#include "micro_batch_overlap.hpp"
#include "mpi_world.hpp"
#include "no_sm_held.hpp"
#include "session.hpp"
#include "stats.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

// --expert-capacity / --expert-packed-rows auto (the default).
constexpr int kExpertRowsAuto = -1;

struct BenchOptions {
  CommonOptions common;
  int min_tokens = 1, max_tokens = 4096, step_factor = 2;
  std::vector<int> token_list;  // overrides -b/-e/-f
  int hidden = 7168, top_k = 8, experts = 256;
  std::string dtype = "bf16", combine_dtype;
  std::string routing = "uniform";
  double zipf_s = 1.2, mask_fraction = 0.0;
  int warmup = 5, iters = 20, check = 1;
  bool graph = false, baselines = true;
  bool zero_copy_combine = false;  // expert output written into the dispatch result's combine_input view
  bool launch_gate = true;  // queue each batch of launches ahead (GPU time); false: host-driven
  bool decode_step = false;   // dispatch -> stand-in expert -> combine, one graph per step with -G
  bool overlap_gemm = false;  // dispatch and combine beside a cuBLAS GEMM
  std::vector<int> gemm_mnk;  // the overlap's GEMM, M,N,K; empty = sized at each size
  bool micro_batch_overlap = false;  // two micro-batches, the halves of one around the other's GEMMs
  int expert_intermediate = kDeepSeekExpertIntermediate;  // the micro-batches' expert GEMMs
  std::string expert_rows = "picks";  // their M: picks (of this rank's experts) | rows (received, once each)
  bool no_sm_held = false;            // a GEMM on every SM between a send half and its receive half
  // The sweep's receive layouts: rank_major | expert_major | expert_packed |
  // rank_major+user (RANK_MAJOR and the reference permute kernels,
  // user_permute.hpp) | all (the four, one after the other).
  std::string layout = "rank_major";
  int expert_alignment = 0;  // params->expert_alignment (EXPERT_PACKED and the reference kernels; 0 = 1)
  // params->expert_capacity (EXPERT_MAJOR) and params->expert_rows
  // (EXPERT_PACKED): kExpertRowsAuto = what a server would choose from the
  // bench's own routing (expert_rows_needed), 0 = the library's worst case.
  int expert_capacity = kExpertRowsAuto;
  int expert_packed_rows = kExpertRowsAuto;
  // How the two were chosen, for the layout headings (set where they are resolved).
  std::string expert_capacity_note, expert_packed_rows_note;
  // The expert of --decode-step and --micro-batch-overlap: stand_in (the
  // copy kernel, resp. one GEMM on random operands per projection) | grouped
  // (grouped_expert.hpp: cuBLAS grouped GEMMs on the EXPERT_PACKED rows).
  std::string expert_gemm = "stand_in";
  // The sweep's wire formats: as_is | fp8 (params->dispatch_wire and
  // combine_wire FP8_E4M3_BLOCK128) | fp8_dispatch (dispatch_wire only) |
  // quantize+as_is (reference_quantize.hpp, then an AS_IS dispatch of the
  // e4m3 rows and fp32 scales; GPU) | all (the four, one after the other).
  std::string wire = "as_is";
  std::string wire_scale = "fp32";   // params->wire_scale: fp32 | ue8m0
  bool dispatch_dequantize = false;  // params->dispatch_dequantize with an FP8 dispatch wire
  bool sizes_given = false;   // -t, -b, -e or -f was on the command line (main sets it)
  std::string json_path;
  // One of the modes that replace the sweep was asked for.
  bool special_mode() const { return decode_step || overlap_gemm || micro_batch_overlap || no_sm_held; }
};

// Everything measured at one size.
struct SizeResult {
  int tokens = 0;
  std::string layout = "rank_major";  // BenchOptions::layout's names, one layout
  std::string wire = "as_is";         // BenchOptions::wire's names, one wire
  Traffic traffic;
  int64_t wrong_dispatch = -1, wrong_combine = -1;  // -1: not checked
  PhaseTiming dispatch, combine;
  bool gate_expired = false;
  int32_t dispatch_path = MOE_EP_PATH_NONE, combine_path = MOE_EP_PATH_NONE;  // moe_ep_get_last_path on this rank
  bool has_ceiling = false;
  PhaseTiming ceiling_dispatch, ceiling_combine;
  bool has_nccl = false;
  PhaseTiming nccl_dispatch, nccl_counts, nccl_payload, nccl_combine;
  int64_t nccl_wrong_counts = 0;
  // dispatch + combine per iteration; rank_major+user: dispatch + permute +
  // unpermute + combine, with the reference kernels' own times.
  PhaseTiming pair;
  bool has_user = false;
  PhaseTiming permute, unpermute;
  // quantize+as_is: the reference quantize kernel, and it + the dispatch.
  bool has_quantize = false;
  PhaseTiming quantize, quantize_dispatch;
};

// The layouts --layout names, in the order the sweep runs them.
std::vector<std::string> bench_layouts(const std::string& layout);
// The wires --wire names, likewise.
std::vector<std::string> bench_wires(const std::string& wire);

// Everything one run measured: the sweep's sizes, or the decode step's and
// the overlap's.
struct BenchResults {
  std::vector<SizeResult> sweep;                                     // every layout's sizes, layout after layout
  std::vector<std::pair<std::string, std::string>> layouts_skipped;  // (layout, why)
  std::vector<std::pair<std::string, std::string>> wires_skipped;    // (wire, why)
  std::vector<DecodeStepResult> decode_step;
  std::vector<OverlapResult> overlap;
  std::string overlap_skipped;  // why --overlap-gemm measured nothing ("" = it did, or was not asked)
  std::string decode_split_skipped;  // why --decode-step measured no split step
  std::vector<MicroBatchResult> micro_batch;
  std::string micro_batch_skipped;
  int expert_intermediate = 0;
  std::string expert_rows;
  std::vector<NoSmHeldResult> no_sm_held;
  std::string no_sm_held_skipped;
  // params->expert_capacity and params->expert_rows as passed (0 = the worst
  // case; -1: no handle of that layout), for the JSON.
  int expert_capacity = -1, expert_packed_rows = -1;
};

// The rows the expert layouts need for the bench's routing at `tokens` tokens
// per rank on `world` ranks: the most rows one expert receives (the most
// picks of one expert id, over every rank's tokens), and the most rows one
// rank's EXPERT_PACKED result fills with every expert's rows rounded up to
// `alignment`.
struct ExpertRowsNeeded {
  int64_t per_expert = 0, packed = 0;
};
ExpertRowsNeeded expert_rows_needed(const BenchOptions& options, int world, int tokens, int alignment);

int run_bench(const World& world, const BenchOptions& options);

// The sizes -b/-e/-f (or -t) select.
std::vector<int> bench_sizes(const BenchOptions& options);
// Those of --decode-step: 1, 8, 32 and 128 tokens per rank unless sizes were given.
std::vector<int> decode_step_sizes(const BenchOptions& options);
// Those of --overlap-gemm: 4096 tokens per rank unless sizes were given.
std::vector<int> overlap_sizes(const BenchOptions& options);
// Those of --micro-batch-overlap (tokens per rank of the step, two
// micro-batches of half as many): 256 and 4096 unless sizes were given.
std::vector<int> micro_batch_sizes(const BenchOptions& options);
// Those of --no-sm-held: 128 and 4096 unless sizes were given.
std::vector<int> no_sm_held_sizes(const BenchOptions& options);

}  // namespace moe_ep_tool
