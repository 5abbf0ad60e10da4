// One dispatch/combine workload: the parameters, the routing of every rank and
// the payload, all regenerated on demand from the seed (counter_rng.hpp), so
// that each rank can compute what it must receive without any exchange.  The
// one workload description of the tests and of moe_ep_conformance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep_verify {

enum class RoutingKind { uniform, balanced, zipf };

struct Routing {
  RoutingKind kind = RoutingKind::uniform;
  double zipf_s = 1.2;         // zipf: expert e drawn with weight 1/(e+1)^s
  double mask_fraction = 0.0;  // a pick becomes invalid_expert_id with this probability
  double bad_fraction = 0.0;   // a pick becomes an out-of-range id (bad device data)
};

RoutingKind parse_routing(const std::string& name);
std::string routing_name(RoutingKind kind);

// moe_ep_params_init's defaults with the four required fields filled in.
moe_ep_params_t required_params(int32_t num_experts, int32_t top_k, int32_t max_tokens_per_rank, int32_t hidden_size);

struct WorkloadSpec {
  int world = 1;
  int num_experts = 8;
  int top_k = 2;
  int max_tokens_per_rank = 16;
  int runtime_max_tokens_per_rank = 0;  // 0 = not passed
  int hidden_size = 32;
  moe_ep_dtype_t hidden_dtype{MOE_EP_DTYPE_BFLOAT, 16, 1};
  int hidden_row_elems = 0;  // 0 = hidden_size
  int scale_row_elems = 0;   // 0 = no scales
  moe_ep_dtype_t scale_dtype{MOE_EP_DTYPE_FLOAT, 32, 1};
  int invalid_expert_id = -1;
  bool eplb_stats = false;
  bool eplb_given = false;  // pass eplb_local_stats (else the library counts)
  bool weights = true;
  moe_ep_dtype_t combine_dtype{MOE_EP_DTYPE_BFLOAT, 16, 1};
  Routing routing;
  std::vector<int> tokens;  // local_num_tokens of every rank; empty = drawn from the seed in [0, tpr]
  uint64_t seed = 1;
  // The receive layout (params->receive_layout and its fields, as passed: 0 = default).
  int receive_layout = MOE_EP_LAYOUT_RANK_MAJOR;
  int expert_capacity = 0;
  int expert_alignment = 0;
  int expert_rows = 0;
  bool expert_output_weighted = false;
  int scale_layout = MOE_EP_SCALES_ROW_MAJOR;
  // The low-precision wire (params->dispatch_wire and its fields, as passed).
  int dispatch_wire = MOE_EP_WIRE_AS_IS;
  int combine_wire = MOE_EP_WIRE_AS_IS;
  int wire_scale = MOE_EP_WIRE_SCALE_FP32;
  bool dispatch_dequantize = false;

  int num_tokens(int rank) const;  // local_num_tokens of `rank`
  int tokens_per_rank() const { return runtime_max_tokens_per_rank ? runtime_max_tokens_per_rank : max_tokens_per_rank; }
  int row_elems() const { return hidden_row_elems ? hidden_row_elems : hidden_size; }
  int experts_per_rank() const { return num_experts / world; }
  int64_t receive_rows() const { return int64_t(world) * tokens_per_rank(); }
  bool expert_layout() const { return receive_layout != MOE_EP_LAYOUT_RANK_MAJOR; }
  // The defaults resolved: rows per expert (EXPERT_MAJOR), the alignment and
  // the rows of the result (EXPERT_PACKED), as docs/semantics.md defines them.
  int capacity() const;
  int alignment() const;
  int64_t packed_rows() const;
  // Rows of the expert layout's result (E_local * capacity or packed_rows), 0 for RANK_MAJOR.
  int64_t expert_layout_rows() const;
  // Rows of combine's expert_output: receive_rows() or expert_layout_rows().
  int64_t combine_rows() const { return expert_layout() ? expert_layout_rows() : receive_rows(); }
  uint64_t hidden_row_bytes() const;
  uint64_t scale_row_bytes() const;
  // The rows and scales dispatch returns: the caller's, or with an FP8
  // dispatch wire e4m3fn rows and ceil(row_elems / 128) fp32 scales (none
  // with dispatch_dequantize, whose rows are of hidden_dtype again).
  bool fp8_dispatch() const { return dispatch_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128; }
  bool fp8_combine() const { return combine_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128; }
  bool wire_scales() const { return fp8_dispatch() && !dispatch_dequantize; }
  moe_ep_dtype_t recv_hidden_dtype() const;
  uint64_t recv_hidden_row_bytes() const;
  int recv_scale_row_elems() const;
  moe_ep_dtype_t recv_scale_dtype() const;
  uint64_t recv_scale_row_bytes() const;
  uint64_t combine_row_bytes() const;
  // The rank that owns expert id, or -1 for the invalid id and bad ids; found
  // by scanning the ranks' ranges, not by the library's division.
  int owner(int32_t id) const;
  moe_ep_params_t params() const;
  std::string describe() const;
};

struct RankRouting {
  int num_tokens = 0;
  std::vector<int32_t> topk_ids;    // [T, K]
  std::vector<float> topk_weights;  // [T, K]
};

RankRouting make_routing(const WorkloadSpec& spec, int rank);
std::vector<RankRouting> make_all_routing(const WorkloadSpec& spec);

// The routing the model sees under an active-rank mask (docs/semantics.md,
// "Active ranks"): every pick of an expert owned by an inactive rank, and
// every pick of an inactive rank's tokens, becomes invalid_expert_id; token
// counts and weights stay.  active[r] != 0: rank r active.
std::vector<RankRouting> mask_routing(const WorkloadSpec& spec, std::vector<RankRouting> all,
                                      const std::vector<uint8_t>& active);

// Everything rank `rank` passes to dispatch, as host copies.
struct RankInputs {
  RankRouting routing;
  std::vector<uint8_t> hidden;      // [T, row bytes]
  std::vector<uint8_t> scales;      // [T, scale row bytes]
  std::vector<int32_t> eplb_local;  // [E] when spec.eplb_given
};
RankInputs make_rank_inputs(const WorkloadSpec& spec, int rank);

// Whether token t of this routing has a valid pick owned by rank dest.
bool goes_to(const WorkloadSpec& spec, const RankRouting& routing, int token, int dest);

// Payload of token `token` of rank `rank`: random bytes (rows travel opaque).
void fill_hidden_row(const WorkloadSpec& spec, int rank, int token, uint8_t* out);
void fill_scale_row(const WorkloadSpec& spec, int rank, int token, uint8_t* out);
// What dispatch delivers for that token: the row and scales as passed, or
// through the FP8 wire (verify/wire_oracle.cpp): recv_hidden_row_bytes() and
// recv_scale_row_bytes().
void fill_received_row(const WorkloadSpec& spec, int rank, int token, uint8_t* hidden, uint8_t* scales);
std::vector<uint8_t> make_hidden(const WorkloadSpec& spec, int rank);  // [T, row bytes]
std::vector<uint8_t> make_scales(const WorkloadSpec& spec, int rank);  // [T, scale row bytes]
// The eplb_local_stats rank passes when spec.eplb_given.
std::vector<int32_t> make_eplb_local(const WorkloadSpec& spec, int rank);

// Element h of row `row` of rank `rank`'s expert_output, already rounded to
// combine_dtype, in [-2, 2]: padding rows too (combine must ignore them).
float expert_output_value(const WorkloadSpec& spec, int rank, int64_t row, int h);
// [combine_rows(), H] combine_dtype: receive rows, or expert rows in an expert layout.
std::vector<uint8_t> make_expert_output(const WorkloadSpec& spec, int rank);

}  // namespace moe_ep_verify
