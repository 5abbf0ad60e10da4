// The tool's checker: what one rank must receive from dispatch and get back
// from combine (SPEC §4), computed from every rank's regenerated routing, and
// compared element by element with what the library returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.hpp"

namespace moe_ep_tool {

// Wrong elements found, with the first few described.
struct Verdict {
  int64_t wrong = 0;
  std::string details;  // at most a few lines

  void add(int64_t count, const std::string& what);
  void merge(const Verdict& other);
};

// Host copies of one rank's dispatch result.
struct ReceivedDispatch {
  int tokens_per_rank = 0;
  std::vector<uint8_t> hidden;              // [P, row bytes]
  std::vector<uint8_t> scales;              // [P, scale row bytes], if scales
  std::vector<int32_t> topk_ids;            // [P, K]
  std::vector<float> topk_weights;          // [P, K], if weights
  std::vector<int32_t> recv_counts;         // [world]
  std::vector<int32_t> local_expert_counts; // [E / world]
  std::vector<int32_t> eplb_gathered;       // [world, E], if eplb stats
  bool has_weights = false, has_scales = false, has_eplb = false;
};

Verdict check_dispatch(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                       const ReceivedDispatch& got);

// output: [T_me, H] of combine_dtype, as returned by combine on rank `me`,
// when every rank r passed make_expert_output(spec, r).
Verdict check_combine(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output);

}  // namespace moe_ep_tool
