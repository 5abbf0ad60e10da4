// The bench's expert output and dispatch check in an expert layout, on the
// rows that hold a pair only.  An expert layout's result is sized for the
// capacity (EXPERT_MAJOR: E_local x capacity rows, 14 GB at the worst-case
// capacity in the DeepSeek shape), of which the pairs fill a small part; the
// oracle's own path (make_expert_output, read_dispatch) generates, uploads and
// reads back every row, which at that size takes minutes per size.  Here:
//   - the expert output combine takes is the oracle's value
//     (expert_output_value) on every pair row and NaN on every padding row,
//     so that a combine that reads padding shows as #wrong (docs/semantics.md:
//     padding rows are never read);
//   - the dispatch check reads back every metadata tensor whole (row_sources
//     and row_weights on every row, padding included: 16 bytes a row) and
//     compares them with the oracle (check_expert_fields), and reads and
//     compares the payload of the pair rows only, expert by expert (padding
//     payload is unspecified, as in the oracle).
// The rank-major layout keeps the oracle's own path (its rows are the
// received rows).
#pragma once

#include <vector>

#include "ep_calls.hpp"

namespace moe_ep_tool {

// Writes rank `rank`'s expert output for `spec` (an expert layout) at
// `target`, [combine_rows(), H] of combine_dtype in `place`'s memory: the pair
// rows of the oracle's placement for every rank's routing `all`, NaN elsewhere.
void write_expert_layout_output(const WorkloadSpec& spec, int rank, const std::vector<RankRouting>& all,
                                const Place& place, void* target, void* stream);

// Rank `rank`'s dispatch result `result` in an expert layout against the
// oracle, as check_dispatch would count it (the same fields and rows, each
// wrong entry or payload row one), reading back only the pair rows' payload.
Verdict check_expert_layout_dispatch(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int rank,
                                     const moe_ep_dispatch_result_t& result, const Place& place, void* stream);

}  // namespace moe_ep_tool
