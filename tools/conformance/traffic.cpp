#include "traffic.hpp"

#include "wire_oracle.hpp"

namespace moe_ep_tool {

uint64_t fp8_wire_row_bytes(int64_t elems) { return uint64_t(elems) + uint64_t(oracle_wire_blocks(elems)) * 4; }

int64_t Traffic::remote_rows(int s) const {
  int64_t n = 0;
  for (int d = 0; d < world; ++d) n += d == s ? 0 : rows_between(s, d);
  return n;
}

int64_t Traffic::all_rows(int s) const {
  int64_t n = 0;
  for (int d = 0; d < world; ++d) n += rows_between(s, d);
  return n;
}

double Traffic::mean_remote_bytes(uint64_t row_bytes) const {
  double total = 0;
  for (int s = 0; s < world; ++s) total += double(remote_rows(s)) * double(row_bytes);
  return total / world;
}

double Traffic::mean_alg_bytes(uint64_t row_bytes) const {
  double total = 0;
  for (int s = 0; s < world; ++s) total += double(all_rows(s)) * double(row_bytes);
  return total / world;
}

double Traffic::mean_sel_bytes(uint64_t row_bytes) const {
  double total = 0;
  for (int s = 0; s < world; ++s) total += double(picks[s]) * double(row_bytes);
  return total / world;
}

Traffic measure_traffic(const WorkloadSpec& spec, const std::vector<RankRouting>& all) {
  Traffic t;
  t.world = spec.world;
  t.rows.assign(size_t(spec.world) * spec.world, 0);
  t.picks.assign(spec.world, 0);
  t.dispatch_row_bytes =
      spec.fp8_dispatch() ? fp8_wire_row_bytes(spec.row_elems()) : spec.hidden_row_bytes() + spec.scale_row_bytes();
  t.combine_row_bytes = spec.fp8_combine() ? fp8_wire_row_bytes(spec.hidden_size) : spec.combine_row_bytes();
  for (int s = 0; s < spec.world; ++s) {
    const RankRouting& r = all[s];
    for (int tok = 0; tok < r.num_tokens; ++tok) {
      for (int d = 0; d < spec.world; ++d) t.rows[size_t(s) * spec.world + d] += goes_to(spec, r, tok, d) ? 1 : 0;
      for (int k = 0; k < spec.top_k; ++k) t.picks[s] += spec.owner(r.topk_ids[size_t(tok) * spec.top_k + k]) >= 0;
    }
  }
  return t;
}

std::vector<std::string> traffic_formulas(const std::string& link, const std::string& crossing) {
  return {
      "rows(s->d) = tokens of rank s with >= 1 valid pick owned by rank d (sent once per rank, not per expert)",
      "B_dispatch = hidden_row_bytes + scale_row_bytes (ids and weights, 8*top_k B per row, not counted)",
      "B_combine = hidden_size * sizeof(combine dtype)",
      "FP8 wire (--wire): B of an FP8 direction = n + ceil(n / 128) * 4 (e4m3 codes and fp32 scales of an n-element "
      "row: n = hidden_row_elems in dispatch, hidden_size in combine) instead of the row's own bytes",
      link + "_bytes = mean over ranks s of sum_{d != s} rows(s->d) * B  (bytes that " + crossing + ", each direction)",
      "alg_bytes = mean over ranks s of sum_{d} rows(s->d) * B  (local rows included)",
      "sel_bytes = mean over ranks s of valid_picks(s) * B  (per expert, not deduplicated)",
      "time = per-iteration max over ranks; busbw = " + link + "_bytes / time; algbw = alg_bytes / time",
  };
}

}  // namespace moe_ep_tool
