// Validated, defaulted parameters and configuration, and the layout maths that
// every backend shares (row sizes, expert ownership).
#pragma once

#include <cstdint>

#include "moe_ep_c.h"

namespace moe_ep {

constexpr int32_t kDefaultTimeoutMs = 30000;
// config->micro_batches: dispatch/combine pairs a handle can hold in flight (docs/overlap.md).
constexpr int32_t kMaxMicroBatches = 2;

// Upper limits of the params (docs/api.md, "Limits"): each well above what a
// production MoE layer uses, low enough that a typo or a hostile value is
// refused at once instead of allocating for minutes.
constexpr int32_t kMaxNumExperts = 65536;                // largest models: 256-384; research MoEs: 1000s
constexpr int32_t kMaxTopK = 128;                        // largest models: 8-16 picks per token
constexpr int32_t kMaxHiddenSize = 65536;                // largest models: 7168-16384
constexpr int32_t kMaxRowElems = 65536;                  // hidden_row_elems and scale_row_elems
constexpr int32_t kMaxTokensPerRank = int32_t{1} << 20;  // prefill chunks: 8K-128K tokens
// Per-rank footprint bound (every backend's workspace is at most this
// estimate); 1 TiB is several times any accelerator's memory.
constexpr uint64_t kMaxWorkspaceBytes = uint64_t{1} << 40;
// params->expert_alignment: 128 is the common GEMM tile, 256 the largest one.
constexpr int32_t kMaxExpertAlignment = 256;
// Rows of an expert layout are int32 indices (row_sources, expert_offsets).
constexpr int64_t kMaxExpertRows = INT32_MAX;

moe_ep_params_t default_params();
moe_ep_config_t default_config();

// Read the caller's versioned struct, fill defaults, validate every field that
// does not depend on the group (INVALID_ARGUMENT naming the field otherwise).
moe_ep_params_t read_params(const moe_ep_params_t* user);
moe_ep_config_t read_config(const moe_ep_config_t* user);  // NULL = defaults

// Everything about the shapes of one group, derived once at create.
struct Layout {
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int32_t max_tokens_per_rank = 0;
  int32_t hidden_size = 0;
  moe_ep_dtype_t hidden_dtype{};
  int32_t hidden_row_elems = 0;
  uint64_t hidden_row_bytes = 0;
  int32_t scale_row_elems = 0;
  moe_ep_dtype_t scale_dtype{};
  uint64_t scale_row_bytes = 0;
  int32_t invalid_expert_id = -1;
  bool eplb_stats = false;
  moe_ep_dtype_t combine_dtype{};
  uint64_t combine_row_bytes = 0;
  // config->zero_copy_combine: the workspace holds a combine input region of
  // receive_rows(max_tokens_per_rank) combine rows (set from the config, not the params).
  bool zero_copy_combine = false;
  // params->receive_layout and its fields, resolved (docs/semantics.md,
  // "Receive layouts"): capacity and rows are the defaults when 0 was passed.
  int32_t receive_layout = MOE_EP_LAYOUT_RANK_MAJOR;
  int32_t expert_capacity = 0;   // EXPERT_MAJOR: rows per local expert
  int32_t expert_alignment = 1;  // EXPERT_PACKED: first row of each expert a multiple of it
  int32_t expert_rows = 0;       // EXPERT_PACKED: rows of the result, padding included
  bool expert_output_weighted = false;
  int32_t scale_layout = MOE_EP_SCALES_ROW_MAJOR;
  // The low-precision wire (docs/semantics.md, "A low-precision wire").  With
  // an FP8 dispatch wire, hidden_* and scale_* above still describe the
  // caller's input rows (scale_row_elems is 0); the received rows are e4m3
  // with wire_scale_row_elems() fp32 scales each unless dispatch_dequantize.
  int32_t dispatch_wire = MOE_EP_WIRE_AS_IS;
  int32_t combine_wire = MOE_EP_WIRE_AS_IS;
  int32_t wire_scale = MOE_EP_WIRE_SCALE_FP32;
  bool dispatch_dequantize = false;

  bool fp8_dispatch() const { return dispatch_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128; }
  bool fp8_combine() const { return combine_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128; }
  // Scales per row an FP8 wire makes: ceil(hidden_row_elems / 128).
  int32_t wire_scale_row_elems() const { return (hidden_row_elems + 127) / 128; }
  // Scales per combine row an FP8 combine wire makes: ceil(hidden_size / 128).
  int32_t combine_wire_scale_row_elems() const { return (hidden_size + 127) / 128; }

  int32_t experts_per_rank() const { return num_experts / world_size; }
  // Rank owning a valid expert id (caller checks the id is in range).
  int32_t owner_of(int32_t expert) const { return expert / experts_per_rank(); }
  bool is_valid_expert(int32_t id) const { return id >= 0 && id < num_experts; }
  int64_t receive_rows(int32_t tokens_per_rank) const {
    return static_cast<int64_t>(world_size) * tokens_per_rank;
  }
  bool expert_layout() const { return receive_layout != MOE_EP_LAYOUT_RANK_MAJOR; }
  // Rows of an expert layout's result (E_local * capacity, or expert_rows); 0 for RANK_MAJOR.
  int64_t expert_layout_rows() const {
    if (receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) return static_cast<int64_t>(experts_per_rank()) * expert_capacity;
    return receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? expert_rows : 0;
  }
  // Rows of combine's expert_output (and of the combine_input view) for a
  // dispatch with this tokens_per_rank.
  int64_t combine_rows(int32_t tokens_per_rank) const {
    return expert_layout() ? expert_layout_rows() : receive_rows(tokens_per_rank);
  }
  // Elements of the result's hidden_states_scale in an expert layout: rows * S
  // row-major; column-major pads each column to a multiple of 4 rows.
  int64_t expert_scale_elems() const;
};

// Rows of a column-major scale column: `rows` rounded up to a multiple of 4
// (16 bytes of fp32, the alignment TMA needs).
constexpr int64_t kScaleColumnAlignment = 4;
inline int64_t scale_column_rows(int64_t rows) {
  return (rows + kScaleColumnAlignment - 1) / kScaleColumnAlignment * kScaleColumnAlignment;
}

// EXPERT_PACKED's default expert_rows: the most rows any dispatch can need,
// world * max_tokens_per_rank * min(top_k, E_local) + E_local * (alignment - 1),
// rounded down to a multiple of the alignment (the aligned total is one, so it
// still fits).
int64_t worst_case_expert_rows(int32_t world_size, int32_t max_tokens_per_rank, int32_t top_k, int32_t experts_per_rank,
                               int32_t alignment);

// The layout of the rows as an FP8 dispatch wire carries them: e4m3fn rows of
// hidden_row_elems bytes with wire_scale_row_elems() fp32 scales each, as if
// the caller had passed them (`l` itself when dispatch_wire is AS_IS).
Layout wire_layout(const Layout& l);
// The layout of dispatch's result rows: wire_layout(l), or `l` with
// dispatch_dequantize (rows back in hidden_dtype, no scales).
Layout received_layout(const Layout& l);

// Validates the group-dependent rules (world_size > 0, num_experts % world_size == 0).
Layout make_layout(const moe_ep_params_t& params, int32_t world_size, int32_t rank);

// Bytes of the zero-copy combine input region: combine_rows(max_tokens_per_rank)
// rows of combine_row_bytes, or 0 when the layout does not have one.
uint64_t combine_input_region_bytes(const Layout& layout);

}  // namespace moe_ep
