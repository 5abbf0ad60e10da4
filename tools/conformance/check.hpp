// `moe_ep_conformance check`: runs the case matrix against the oracle
// (moe_ep_verify) and reports #wrong per case; non-zero exit on any wrong
// element.  The matrix (check_cases.cpp): each case is a workload shape that
// exercises one rule of dispatch and combine, instantiated for the job's world
// size.  The checker's self-test (fault_injection.cpp): --inject-fault
// corrupts, on rank 0, the host copy of a result before it is compared, so that
// a test can prove that `check` notices a wrong byte, a wrong row order, a
// wrong count or a wrong sum (a checker that never fails proves nothing).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mpi_world.hpp"
#include "oracle.hpp"
#include "session.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

struct CheckOptions {
  CommonOptions common;
  int rounds = 2;                     // eager calls per case on one handle, fresh inputs each
  std::string filter;                 // run only cases whose name contains this
  std::string modes = "auto";         // eager | graph | both | auto (both on GPU, eager on host)
  bool poison_results = true;         // overwrite dispatch payload results before combine
  bool list = false;                  // print the case names and exit
  std::string inject_fault = "none";  // self-test of the checker (fault_injection.cpp)
  bool zero_copy_combine = false;     // every case through the combine_input view
  std::string phases = "fused";       // fused | split | both: the calls the eager rounds go through
                                      // (split: two micro-batches in flight through the halves)
  std::string layouts = "all";        // rank_major | expert_major | expert_packed | all: the receive
                                      // layouts every case runs in (a backend without one: SKIPPED)
  std::string wires =
      "as_is";  // as_is | fp8 | fp8_dispatch | fp8_dequantize | all: the wire formats every case runs with
  std::string wire_scale = "fp32";  // fp32 | ue8m0: params->wire_scale of the FP8 wires
  std::vector<int> inactive_ranks;  // every case under an active-rank mask without these ranks
};

// The receive layouts named by --layouts (MOE_EP_LAYOUT_*); throws ToolError otherwise.
std::vector<int> parse_layouts(const std::string& name);
// "rank_major", "expert_major" or "expert_packed".
const char* layout_name(int layout);
// The wire formats named by --wire (MOE_EP_WIRE_*); throws ToolError otherwise.
std::vector<int> parse_wires(const std::string& name);
// The MOE_EP_WIRE_SCALE_* named by --wire-scale (fp32 or ue8m0); throws ToolError otherwise.
int parse_wire_scale(const std::string& name);

int run_check(const World& world, const CheckOptions& options);

enum class TokenRule {
  random,      // each rank: uniform in [0, tokens_per_rank]
  full,        // each rank: tokens_per_rank
  zero,        // every rank: 0
  rank0_zero,  // rank 0: 0, the others: tokens_per_rank
  unequal,     // rank r: (5r + 3) mod (tokens_per_rank + 1), all different for small worlds
};

struct CheckCase {
  std::string name;
  WorkloadSpec shape;          // world, num_experts, tokens and seed are set per run
  int experts_per_rank = 4;    // num_experts = experts_per_rank * world ...
  int min_experts = 0;         // ... rounded up to at least this (a multiple of world)
  bool top_k_is_all = false;   // top_k = num_experts
  bool invalid_above = false;  // invalid_expert_id = num_experts + 5 (a positive invalid id)
  bool zero_copy = false;      // config->zero_copy_combine: the expert output goes into the
                               // dispatch result's combine_input view, which combine then takes
  TokenRule tokens = TokenRule::random;
  // The receive layout (set per run from --layouts) and the expert layouts'
  // knobs, each applied only in the layout it belongs to.
  int layout = MOE_EP_LAYOUT_RANK_MAJOR;
  int expert_capacity = 0;   // EXPERT_MAJOR
  int expert_alignment = 0;  // EXPERT_PACKED
  int expert_rows = 0;       // EXPERT_PACKED
  bool expert_output_weighted = false;
  bool column_major_scales = false;  // expert layouts: MOE_EP_SCALES_COLUMN_MAJOR
  bool expert_layouts_only = false;  // a case about the expert layouts: not run in RANK_MAJOR
  // The wire format (set per run from --wire): FP8 quantizes combine, and
  // dispatch too where the case's rows are bf16, fp16 or fp32 without scales
  // (rows already quantized by the caller keep the AS_IS dispatch wire);
  // kWireFp8DispatchOnly, kWireFp8Dequantize: that dispatch wire alone, combine AS_IS.
  int wire = MOE_EP_WIRE_AS_IS;
  int wire_scale = MOE_EP_WIRE_SCALE_FP32;  // the FP8 wires' scale rule (from --wire-scale)
};

// --wire fp8_dispatch's and fp8_dequantize's values of CheckCase::wire (the
// tool's own, not MOE_EP_WIRE_* values): the FP8 dispatch wire alone, its rows
// received as they crossed or (params->dispatch_dequantize) in hidden_dtype again.
constexpr int kWireFp8DispatchOnly = 2;
constexpr int kWireFp8Dequantize = 3;

std::vector<CheckCase> check_cases();

// The case for this world; `seed` drives routing and payload, `count_seed`
// the token counts (fixed across graph replays, which need a fixed T).
WorkloadSpec instantiate(const CheckCase& c, int world, uint64_t seed, uint64_t count_seed);

enum class Fault { none, dispatch_payload, dispatch_order, recv_counts, combine_output };

Fault parse_fault(const std::string& name);

// Each returns whether it found something to corrupt.
bool inject_fault(Fault fault, const WorkloadSpec& spec, ReceivedDispatch& got);
bool inject_fault(Fault fault, const WorkloadSpec& spec, std::vector<uint8_t>& combine_output);

}  // namespace moe_ep_tool
