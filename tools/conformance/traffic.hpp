// What a workload moves, and the byte formulas the benchmark reports.
//   rows(s->d)   tokens of rank s with at least one valid pick owned by rank d
//                (what dispatch delivers to d, once per rank, never per expert)
//   B_dispatch   hidden_row_bytes + scale_row_bytes (payload; the 8*top_k
//                bytes of ids and weights per row are not counted)
//   B_combine    hidden_size * sizeof(combine dtype)
//   FP8 wire     a direction with an FP8 wire moves n + ceil(n / 128) * 4 bytes
//                per row of n elements (e4m3 codes, fp32 scales) instead
//                (what crosses, not what the caller passes or receives)
//   remote bytes of rank s: sum over d != s of rows(s->d) * B   (leave the
//                rank: cross NVLink on the nvlink backend)
//   alg bytes    of rank s: sum over all d of rows(s->d) * B    (local rows too;
//                DeepEP's "logical" bytes)
//   sel bytes    of rank s: valid picks of s * B (per expert, not deduplicated;
//                DeepEP low-latency / NCCL EP bytes)
//   busbw = mean over ranks of remote bytes / time, algbw = mean of alg bytes / time.
// In combine the same rows travel back (rank d to rank s) with B_combine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

struct Traffic {
  int world = 1;
  std::vector<int64_t> rows;   // [s * world + d] = rows(s->d)
  std::vector<int64_t> picks;  // [s] valid picks
  uint64_t dispatch_row_bytes = 0, combine_row_bytes = 0;

  int64_t rows_between(int s, int d) const { return rows[size_t(s) * world + d]; }
  int64_t remote_rows(int s) const;
  int64_t all_rows(int s) const;
  // Means over ranks, for the given row size.
  double mean_remote_bytes(uint64_t row_bytes) const;
  double mean_alg_bytes(uint64_t row_bytes) const;
  double mean_sel_bytes(uint64_t row_bytes) const;
};

// The bytes an FP8_E4M3_BLOCK128 wire moves for a row of `elems` elements.
uint64_t fp8_wire_row_bytes(int64_t elems);

Traffic measure_traffic(const WorkloadSpec& spec, const std::vector<RankRouting>& all);

// The formulas above as one-line strings, for the table header and the JSON,
// in the backend's words (link: "nvl" / "cross NVLink", ...).
std::vector<std::string> traffic_formulas(const std::string& short_name, const std::string& crossing);

}  // namespace moe_ep_tool
