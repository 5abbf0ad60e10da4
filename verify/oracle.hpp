// The oracle: what one rank must receive from dispatch and get back from
// combine (docs/semantics.md), computed from every rank's regenerated inputs,
// and element-by-element comparisons with what a backend returned.
//
// It is independent of the library's own model (src/reference_model.cpp, the
// HOST backend) in code and in method: the library gives each token a receive
// slot with a running counter per destination, the oracle lists, per source and
// destination, the tokens that go there (a filter) and finds a token's row by
// searching that list.  Nothing here links the library's internals.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "workload.hpp"

namespace moe_ep_verify {

// Wrong elements found, with the first few described.
struct Verdict {
  int64_t wrong = 0;
  std::string details;  // at most a few lines

  void add(int64_t count, const std::string& what);
  void merge(const Verdict& other);
};

// Adds to `v`, under `name`, the entries of `got` that differ from `expected`
// (ints by value, floats by their bits), naming the first; sizes that differ
// count as max(expected size, 1) wrong.
void compare_entries(Verdict& v, const char* name, const std::vector<int32_t>& expected,
                     const std::vector<int32_t>& got);
void compare_entries(Verdict& v, const char* name, const std::vector<float>& expected, const std::vector<float>& got);

// Host copies of one rank's dispatch result.
struct ReceivedDispatch {
  int tokens_per_rank = 0;
  std::vector<uint8_t> hidden;               // [P, row bytes]
  std::vector<uint8_t> scales;               // [P, scale row bytes], if scales
  std::vector<int32_t> topk_ids;             // [P, K]
  std::vector<float> topk_weights;           // [P, K], if weights
  std::vector<int32_t> recv_counts;          // [world]
  std::vector<int32_t> local_expert_counts;  // [E / world]
  std::vector<int32_t> eplb_gathered;        // [world, E], if eplb stats
  bool has_weights = false, has_scales = false, has_eplb = false;
  // Expert layouts (docs/semantics.md, "Receive layouts"): hidden then holds
  // the expert rows, scales the scale elements as laid out (rows or columns).
  std::vector<int32_t> expert_counts;   // [E_local]
  std::vector<int32_t> expert_offsets;  // [E_local + 1], EXPERT_PACKED
  std::vector<int32_t> row_sources;     // [rows, 3]
  std::vector<float> row_weights;       // [rows]
  std::vector<int32_t> dropped_pairs;   // [1]
};

// Where the expert layouts put every (source rank, source token, pick) on one
// destination rank: from the routing of every rank, by filtering the picks
// of each local expert (ascending source rank, token, pick) and cutting the
// list at the capacity (EXPERT_MAJOR) or where expert_rows runs out
// (EXPERT_PACKED, experts in ascending order).
struct ExpertPlacement {
  std::vector<int32_t> counts;   // [E_local] rows written
  std::vector<int32_t> offsets;  // [E_local + 1]
  int64_t dropped = 0;           // pairs that did not fit
  std::vector<int32_t> sources;  // [rows, 3], -1 on padding
  std::vector<float> weights;    // [rows], 0 on padding
  // row_of[src][t * K + k]: the expert row of that pick, -1 if none.
  std::vector<std::vector<int64_t>> row_of;
};
ExpertPlacement place_expert_rows(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int dest);

// Checks rank `me`'s dispatch result against the oracle: counts, ids and
// weights on every row (padding rows hold invalid_expert_id and weight 0),
// payload bytes on the rows that carry a token (padding payload is
// unspecified).  `all` is every rank's routing (make_all_routing, or edited
// copies of it); payload rows are regenerated from the spec.
Verdict check_dispatch(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                       const ReceivedDispatch& got);

// output: [T_me, H] of combine_dtype, as returned by combine on rank `me`,
// when every rank r passed make_expert_output(spec, r).  Exact: the fp32 sum
// in ascending rank order, rounded once; compared as values (NaN, the poison,
// never matches).
Verdict check_combine(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output);

// What an expert computation wrote on rank `expert_rank` in its receive row
// `row` (an expert row in an expert layout), which holds token `token` of the
// rank being checked: fills `out` with hidden_size values, already rounded to
// combine_dtype.
//
// In an expert layout, check_combine sums per rank r (ascending) the token's
// rows on r in ascending (local expert, pick) order from 0 in fp32, each
// multiplied by its weight (1 without topk_weights) unless
// spec.expert_output_weighted, rounds that partial to combine_dtype, and
// adds the partials in fp32 as the rank-major combine adds rows.
using ExpertRowModel = std::function<void(int expert_rank, int64_t row, int token, float* out)>;

// check_combine for any expert computation: the same sum and comparison, with
// the expert rows taken from `expert_rows` instead of make_expert_output.
Verdict check_combine(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output, const ExpertRowModel& expert_rows);

// Two backends' results of the same dispatch, field by field, with the same
// rules as check_dispatch (payload compared on the reference's token rows).
Verdict compare_dispatch(const WorkloadSpec& spec, const ReceivedDispatch& reference, const ReceivedDispatch& got);

}  // namespace moe_ep_verify
