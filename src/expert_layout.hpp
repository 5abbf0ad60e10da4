// The expert layouts on the host (docs/semantics.md, "Receive layouts"): the
// expansion of a rank-major receive into one row per (token, local pick),
// grouped by local expert, and the weighted reduction of the expert output
// back into one rank-major row per received token, which the ordinary combine
// then sums over ranks.  The HOST backend runs them around its exchanges.
#pragma once

#include <cstdint>
#include <vector>

#include "params.hpp"

namespace moe_ep {

// One buffer slot's expert layout results.
struct ExpertRows {
  std::vector<uint8_t> hidden;   // [rows, hidden_row_bytes]
  std::vector<uint8_t> scales;   // expert_scale_elems() scale elements (row-major rows or columns)
  std::vector<int32_t> counts;   // [E_local]
  std::vector<int32_t> offsets;  // [E_local + 1]
  std::vector<int32_t> sources;  // [rows, 3]
  std::vector<float> weights;    // [rows]
  std::vector<int32_t> dropped;  // [1]
  // The expert row of each rank-major (receive row, pick), -1 where the pick
  // is not a local expert or did not fit: [receive_rows(tpr), top_k].
  std::vector<int32_t> pick_rows;
};

// Sizes the buffers for `layout` (its largest tokens_per_rank).
void allocate_expert_rows(const Layout& layout, ExpertRows& rows);
// Host bytes allocate_expert_rows takes.
uint64_t expert_rows_bytes(const Layout& layout);

// The rank-major receive of one dispatch, as the expansion reads it.
struct RankMajorReceive {
  int32_t tokens_per_rank = 0;
  const uint8_t* hidden = nullptr;         // [world*tpr, hidden_row_bytes]
  const uint8_t* scales = nullptr;         // [world*tpr, scale_row_bytes] or NULL
  const int32_t* topk_ids = nullptr;       // [world*tpr, K], local picks only
  const float* topk_weights = nullptr;     // [world*tpr, K], or NULL: every weight is 1.0
  const int32_t* recv_counts = nullptr;    // [world]
  const int32_t* source_tokens = nullptr;  // [world*tpr]: each row's source token index
};

// Lays out the expert rows of `in` (ascending source rank, source token, pick
// inside each expert; pairs beyond the capacity or expert_rows are counted in
// dropped[0] and written nowhere).  Padding: payload and scales zero, sources
// -1, weight 0.
void expand_to_expert_rows(const Layout& layout, const RankMajorReceive& in, ExpertRows& out);

// The weighted reduction: for each received token (rank-major row i of the
// dispatch `in` describes), the fp32 sum from 0 of its expert rows in
// ascending (local expert, pick) order, each multiplied by its weight unless
// layout.expert_output_weighted, stored as combine_dtype into row i of
// `rank_major_out` ([world*tpr, combine_row_bytes]; other rows are left as they are).
void reduce_expert_rows(const Layout& layout, const RankMajorReceive& in, const ExpertRows& rows,
                        const uint8_t* expert_output, uint8_t* rank_major_out);

}  // namespace moe_ep
