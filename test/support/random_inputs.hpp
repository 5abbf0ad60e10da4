// Random test cases and an independent brute-force model of dispatch and
// combine, written differently from src/reference_model.cpp on purpose (by
// counting, not by running slots), so that tests of the HOST backend are not
// the model checking itself.  Shared by the CPU, MPI and GPU tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep_test {

struct CaseSpec {
  int world_size = 1;
  int num_experts = 8;
  int top_k = 2;
  int max_tokens_per_rank = 16;
  int hidden_size = 32;
  moe_ep_dtype_t hidden_dtype{MOE_EP_DTYPE_BFLOAT, 16, 1};
  int hidden_row_elems = 0;  // 0 = hidden_size
  int scale_row_elems = 0;
  moe_ep_dtype_t scale_dtype{MOE_EP_DTYPE_FLOAT, 32, 1};
  int invalid_expert_id = -1;
  bool eplb_stats = false;
  bool pass_eplb_local = false;  // pass explicit eplb_local_stats (else counted)
  moe_ep_dtype_t combine_dtype{MOE_EP_DTYPE_BFLOAT, 16, 1};
  bool with_weights = true;
  double mask_fraction = 0.0;   // probability that a pick is invalid_expert_id
  int runtime_max_tokens_per_rank = 0;
  std::vector<int> tokens;      // per rank; empty = random in [0, tokens_per_rank]
  uint64_t seed = 1;

  int tokens_per_rank() const {
    return runtime_max_tokens_per_rank ? runtime_max_tokens_per_rank : max_tokens_per_rank;
  }
  int row_elems() const { return hidden_row_elems ? hidden_row_elems : hidden_size; }
  uint64_t hidden_row_bytes() const;
  uint64_t scale_row_bytes() const;
  uint64_t combine_row_bytes() const;
  int experts_per_rank() const { return num_experts / world_size; }
  std::string describe() const;
  moe_ep_params_t params() const;
};

struct RankData {
  int num_tokens = 0;
  std::vector<int32_t> topk_ids;    // [T, K]
  std::vector<float> topk_weights;  // [T, K]
  std::vector<uint8_t> hidden;      // [T, row bytes]
  std::vector<uint8_t> scales;      // [T, scale row bytes]
  std::vector<int32_t> eplb_local;  // [E] when pass_eplb_local
};

// Deterministic in (spec.seed, rank): every rank can build every rank's input.
RankData make_rank_data(const CaseSpec& spec, int rank);
// Rank `rank`'s expert output, [world * tpr, hidden] of combine_dtype, random
// values in [-2, 2] (padding rows too: combine must ignore them).
std::vector<uint8_t> make_expert_output(const CaseSpec& spec, int rank, uint64_t salt);

struct ExpectedReceive {
  std::vector<int32_t> recv_counts;          // [world]
  std::vector<int32_t> topk_ids;             // [P, K]
  std::vector<float> topk_weights;           // [P, K]
  std::vector<uint8_t> hidden;               // [P, row] (padding rows zero; not compared)
  std::vector<uint8_t> scales;               // [P, srow]
  std::vector<int32_t> local_expert_counts;  // [E / world]
  std::vector<int32_t> eplb_gathered;        // [world, E]
};

ExpectedReceive brute_force_receive(const CaseSpec& spec, const std::vector<RankData>& all, int dest);
// Combine output of `source` as bytes of combine_dtype, [T_source, hidden].
std::vector<uint8_t> brute_force_combine(const CaseSpec& spec, const std::vector<RankData>& all,
                                         const std::vector<std::vector<uint8_t>>& expert_outputs,
                                         int source);

// Compares one rank's dispatch result (host-readable copies) with the model:
// returns "" if equal, else a description of the first differences.  Hidden
// and scale bytes are compared on the recv_counts rows only (padding content
// is unspecified); ids and weights on every row.
struct ReceivedCopy {
  std::vector<int32_t> recv_counts, topk_ids, local_expert_counts, eplb_gathered;
  std::vector<float> topk_weights;
  std::vector<uint8_t> hidden, scales;
  bool has_weights = false;
};
std::string compare_receive(const CaseSpec& spec, const ExpectedReceive& expected, const ReceivedCopy& got);

}  // namespace moe_ep_test
