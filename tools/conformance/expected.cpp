#include "expected.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "dtypes.hpp"

namespace moe_ep_tool {

namespace {
constexpr long kMaxDetailLines = 4;
long line_count(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }
}  // namespace

void Verdict::add(int64_t count, const std::string& what) {
  if (count <= 0) return;
  if (!what.empty() && line_count(details) < kMaxDetailLines) details += what + "\n";
  wrong += count;
}

void Verdict::merge(const Verdict& other) {
  wrong += other.wrong;
  std::istringstream lines(other.details);
  for (std::string line; std::getline(lines, line) && line_count(details) < kMaxDetailLines;) details += line + "\n";
}

namespace {

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// Counts differing entries of two equally sized int vectors.
void compare_ints(Verdict& v, const char* name, const std::vector<int32_t>& expected, const std::vector<int32_t>& got) {
  if (got.size() != expected.size()) {
    v.add(int64_t(expected.size()), std::string(name) + ": expected " + str(expected.size()) + " entries, got " +
                                        str(got.size()));
    return;
  }
  int64_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (got[i] != expected[i] && bad++ == 0) first = i;
  }
  if (bad) {
    v.add(bad, std::string(name) + ": " + str(bad) + " wrong, first [" + str(first) + "] expected " +
                   str(expected[first]) + " got " + str(got[first]));
  }
}

// Units (elements, or bytes of sub-byte types) that differ between two rows.
int64_t differing_units(const uint8_t* a, const uint8_t* b, uint64_t bytes, uint64_t unit) {
  if (std::memcmp(a, b, bytes) == 0) return 0;
  int64_t bad = 0;
  for (uint64_t i = 0; i < bytes; i += unit) bad += std::memcmp(a + i, b + i, std::min(unit, bytes - i)) != 0;
  return bad;
}

struct Expected {
  std::vector<int32_t> recv_counts, topk_ids, local_expert_counts, eplb;
  std::vector<float> topk_weights;
  std::vector<int> source_token;  // per receive row: the source token, -1 for padding
};

Expected expect_receive(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me) {
  const int tpr = s.tokens_per_rank(), K = s.top_k;
  const int64_t P = s.receive_rows();
  Expected e;
  e.recv_counts.assign(s.world, 0);
  e.topk_ids.assign(P * K, s.invalid_expert_id);
  e.topk_weights.assign(P * K, 0.0f);
  e.local_expert_counts.assign(s.experts_per_rank(), 0);
  e.source_token.assign(P, -1);
  for (int src = 0; src < s.world; ++src) {
    const RankRouting& r = all[src];
    int slot = 0;  // ascending source token order
    for (int t = 0; t < r.num_tokens; ++t) {
      if (!goes_to(s, r, t, me)) continue;
      const int64_t row = int64_t(src) * tpr + slot++;
      e.source_token[row] = t;
      for (int k = 0; k < K; ++k) {
        const int32_t id = r.topk_ids[size_t(t) * K + k];
        if (s.owner(id) == me) {
          e.topk_ids[row * K + k] = id;
          ++e.local_expert_counts[id - me * s.experts_per_rank()];
        }
        if (s.weights) e.topk_weights[row * K + k] = r.topk_weights[size_t(t) * K + k];
      }
    }
    e.recv_counts[src] = slot;
  }
  if (s.eplb_stats) {
    for (int src = 0; src < s.world; ++src) {
      std::vector<int32_t> stats(s.num_experts, 0);
      if (s.eplb_given) {
        stats = make_eplb_local(s, src);
      } else {
        for (int32_t id : all[src].topk_ids) {
          if (id >= 0 && id < s.num_experts) ++stats[id];
        }
      }
      e.eplb.insert(e.eplb.end(), stats.begin(), stats.end());
    }
  }
  return e;
}

void check_weights(Verdict& v, const WorkloadSpec& s, const Expected& e, const ReceivedDispatch& got) {
  if (!s.weights) {
    v.add(got.has_weights ? 1 : 0, "topk_weights: returned although no weights were passed");
    return;
  }
  if (!got.has_weights || got.topk_weights.size() != e.topk_weights.size()) {
    v.add(int64_t(e.topk_weights.size()), "topk_weights: missing or of the wrong size");
    return;
  }
  int64_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < e.topk_weights.size(); ++i) {
    if (std::memcmp(&got.topk_weights[i], &e.topk_weights[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  }
  if (bad) {
    v.add(bad, "topk_weights: " + str(bad) + " wrong, first [row " + str(first / s.top_k) + ", pick " +
                   str(first % s.top_k) + "] expected " + str(e.topk_weights[first]) + " got " +
                   str(got.topk_weights[first]));
  }
}

// Payload rows (hidden, scales) on the rows that carry a token; padding
// content is unspecified by SPEC §4.
void check_payload(Verdict& v, const WorkloadSpec& s, const Expected& e, const ReceivedDispatch& got) {
  const uint64_t hb = s.hidden_row_bytes(), sb = s.scale_row_bytes();
  const int64_t P = s.receive_rows();
  if (got.hidden.size() != P * hb) {
    v.add(P, "hidden_states: expected " + str(P * hb) + " bytes, got " + str(got.hidden.size()));
    return;
  }
  if (sb && (!got.has_scales || got.scales.size() != P * sb)) {
    v.add(P, "hidden_states_scale: missing or of the wrong size");
    return;
  }
  std::vector<uint8_t> want(std::max(hb, sb));
  int64_t bad_rows = 0;
  for (int64_t row = 0; row < P; ++row) {
    const int t = e.source_token[row];
    if (t < 0) continue;
    const int src = static_cast<int>(row / s.tokens_per_rank());
    fill_hidden_row(s, src, t, want.data());
    int64_t bad = differing_units(want.data(), &got.hidden[row * hb], hb, compare_unit_bytes(s.hidden_dtype));
    if (sb) {
      fill_scale_row(s, src, t, want.data());
      bad += differing_units(want.data(), &got.scales[row * sb], sb, compare_unit_bytes(s.scale_dtype));
    }
    if (bad && bad_rows++ < 2) {
      v.add(bad, "payload of receive row " + str(row) + " (rank " + str(src) + " token " + str(t) + "): " +
                     str(bad) + " elements wrong");
    } else {
      v.add(bad, "");
    }
  }
}

}  // namespace

Verdict check_dispatch(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                       const ReceivedDispatch& got) {
  Verdict v;
  if (got.tokens_per_rank != s.tokens_per_rank()) {
    v.add(1, "tokens_per_rank: expected " + str(s.tokens_per_rank()) + ", got " + str(got.tokens_per_rank));
    return v;
  }
  const Expected e = expect_receive(s, all, me);
  compare_ints(v, "recv_counts", e.recv_counts, got.recv_counts);
  compare_ints(v, "local_expert_counts", e.local_expert_counts, got.local_expert_counts);
  compare_ints(v, "topk_ids", e.topk_ids, got.topk_ids);
  if (s.eplb_stats) compare_ints(v, "eplb_gathered_stats", e.eplb, got.eplb_gathered);
  check_weights(v, s, e, got);
  check_payload(v, s, e, got);
  return v;
}

Verdict check_combine(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output) {
  Verdict v;
  const RankRouting& mine = all[me];
  const int H = s.hidden_size, T = mine.num_tokens;
  if (output.size() != size_t(T) * s.combine_row_bytes()) {
    v.add(int64_t(T) * H, "output: expected " + str(size_t(T) * s.combine_row_bytes()) + " bytes, got " +
                              str(output.size()));
    return v;
  }
  std::vector<int> next_slot(s.world, 0);
  std::vector<float> acc(H);
  int reported = 0;
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < s.world; ++r) {  // ascending rank order, fp32 accumulation
      if (!goes_to(s, mine, t, r)) continue;
      const int64_t row = int64_t(me) * s.tokens_per_rank() + next_slot[r]++;
      for (int h = 0; h < H; ++h) acc[h] += expert_output_value(s, r, row, h);
    }
    int64_t bad = 0;
    int first = -1;
    for (int h = 0; h < H; ++h) {
      uint32_t rounded[1];
      store_float(s.combine_dtype, rounded, 0, acc[h]);
      const float want = load_float(s.combine_dtype, rounded, 0);
      const float have = load_float(s.combine_dtype, output.data(), int64_t(t) * H + h);
      if (!(have == want) && bad++ == 0) first = h;  // NaN (poison) is never equal
    }
    if (bad && reported++ < 2) {
      uint32_t rounded[1];
      store_float(s.combine_dtype, rounded, 0, acc[first]);
      v.add(bad, "combine output token " + str(t) + ": " + str(bad) + " elements wrong, first [" + str(first) +
                     "] expected " + str(load_float(s.combine_dtype, rounded, 0)) + " got " +
                     str(load_float(s.combine_dtype, output.data(), int64_t(t) * H + first)));
    } else {
      v.add(bad, "");
    }
  }
  return v;
}

}  // namespace moe_ep_tool
