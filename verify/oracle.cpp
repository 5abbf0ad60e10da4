#include "oracle.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <sstream>

#include "dtypes.hpp"
#include "expert_oracle.hpp"
#include "wire_oracle.hpp"

namespace moe_ep_verify {

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

template <typename T>
void compare_entries_as_bits(Verdict& v, const char* name, const std::vector<T>& expected, const std::vector<T>& got) {
  if (expected.size() != got.size()) {
    v.add(int64_t(std::max<size_t>(expected.size(), 1)),
          std::string(name) + ": expected " + str(expected.size()) + " entries, got " + str(got.size()));
    return;
  }
  int64_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &got[i], sizeof(T)) != 0 && bad++ == 0) first = i;
  }
  if (bad) {
    v.add(bad, std::string(name) + ": " + str(bad) + " wrong, first [" + str(first) + "] expected " +
                   str(expected[first]) + " got " + str(got[first]));
  }
}

}  // namespace

void compare_entries(Verdict& v, const char* name, const std::vector<int32_t>& expected,
                     const std::vector<int32_t>& got) {
  compare_entries_as_bits(v, name, expected, got);
}

void compare_entries(Verdict& v, const char* name, const std::vector<float>& expected, const std::vector<float>& got) {
  compare_entries_as_bits(v, name, expected, got);
}

namespace {

// Units (elements, or bytes of sub-byte types) that differ between two rows.
int64_t differing_units(const uint8_t* a, const uint8_t* b, uint64_t bytes, uint64_t unit) {
  if (std::memcmp(a, b, bytes) == 0) return 0;
  int64_t bad = 0;
  for (uint64_t i = 0; i < bytes; i += unit) bad += std::memcmp(a + i, b + i, std::min(unit, bytes - i)) != 0;
  return bad;
}

// Token indices of `source` with a valid pick owned by rank `dest`, ascending:
// the rows of that source's segment on `dest`, in order.
std::vector<int> tokens_sent(const WorkloadSpec& s, const RankRouting& source, int dest) {
  std::vector<int> out;
  for (int t = 0; t < source.num_tokens; ++t) {
    if (goes_to(s, source, t, dest)) out.push_back(t);
  }
  return out;
}

// The expected result of rank `me` (payload left empty: regenerated per row),
// with the source token of every receive row (-1 for padding).
struct Expected {
  ReceivedDispatch result;
  std::vector<int> source_token;
};

Expected expect_receive(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me) {
  const int tpr = s.tokens_per_rank(), K = s.top_k;
  const int64_t P = s.receive_rows();
  Expected e;
  ReceivedDispatch& r = e.result;
  r.tokens_per_rank = tpr;
  r.has_weights = s.weights;
  r.has_scales = s.recv_scale_row_elems() != 0;
  r.has_eplb = s.eplb_stats;
  r.recv_counts.assign(s.world, 0);
  r.topk_ids.assign(P * K, s.invalid_expert_id);
  r.topk_weights.assign(s.weights ? P * K : 0, 0.0f);
  r.local_expert_counts.assign(s.experts_per_rank(), 0);
  e.source_token.assign(P, -1);
  for (int src = 0; src < s.world; ++src) {
    const RankRouting& in = all[src];
    const std::vector<int> sent = tokens_sent(s, in, me);
    r.recv_counts[src] = static_cast<int32_t>(sent.size());
    for (size_t j = 0; j < sent.size(); ++j) {
      const int t = sent[j];
      const int64_t row = int64_t(src) * tpr + int64_t(j);
      e.source_token[row] = t;
      for (int k = 0; k < K; ++k) {
        const int32_t id = in.topk_ids[size_t(t) * K + k];
        if (s.owner(id) == me) {
          r.topk_ids[row * K + k] = id;
          ++r.local_expert_counts[id - me * s.experts_per_rank()];
        }
        if (s.weights) r.topk_weights[row * K + k] = in.topk_weights[size_t(t) * K + k];
      }
    }
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
      r.eplb_gathered.insert(r.eplb_gathered.end(), stats.begin(), stats.end());
    }
  }
  return e;
}

void compare_weights(Verdict& v, const WorkloadSpec& s, const ReceivedDispatch& e, const ReceivedDispatch& got) {
  if (!e.has_weights) {
    v.add(got.has_weights ? 1 : 0, "topk_weights: returned although no weights were passed");
    return;
  }
  if (!got.has_weights || got.topk_weights.size() != e.topk_weights.size()) {
    v.add(int64_t(e.topk_weights.size()), "topk_weights: missing or of the wrong size");
    return;
  }
  int64_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < e.topk_weights.size(); ++i) {  // bit for bit: weights are forwarded, not computed
    if (std::memcmp(&got.topk_weights[i], &e.topk_weights[i], sizeof(float)) != 0 && bad++ == 0) first = i;
  }
  if (bad) {
    v.add(bad, "topk_weights: " + str(bad) + " wrong, first [row " + str(first / s.top_k) + ", pick " +
                   str(first % s.top_k) + "] expected " + str(e.topk_weights[first]) + " got " +
                   str(got.topk_weights[first]));
  }
}

// Everything but the payload rows.
void compare_fields(Verdict& v, const WorkloadSpec& s, const ReceivedDispatch& e, const ReceivedDispatch& got) {
  compare_entries(v, "recv_counts", e.recv_counts, got.recv_counts);
  compare_entries(v, "local_expert_counts", e.local_expert_counts, got.local_expert_counts);
  compare_entries(v, "topk_ids", e.topk_ids, got.topk_ids);
  if (e.has_eplb) compare_entries(v, "eplb_gathered_stats", e.eplb_gathered, got.eplb_gathered);
  compare_weights(v, s, e, got);
}

// Writes the expected hidden and scale bytes of receive row `row`; false for a
// padding row (not compared).
using ExpectedRow = std::function<bool(int64_t row, uint8_t* hidden, uint8_t* scales)>;

// Payload rows (hidden, scales) on the rows that carry a token; padding
// content is unspecified.
void compare_payload(Verdict& v, const WorkloadSpec& s, const ExpectedRow& expected_row, const ReceivedDispatch& got) {
  const uint64_t hb = s.recv_hidden_row_bytes(), sb = s.recv_scale_row_bytes();
  const int64_t P = s.receive_rows();
  if (got.hidden.size() != P * hb) {
    v.add(P, "hidden_states: expected " + str(P * hb) + " bytes, got " + str(got.hidden.size()));
    return;
  }
  if (sb && (!got.has_scales || got.scales.size() != P * sb)) {
    v.add(P, "hidden_states_scale: missing or of the wrong size");
    return;
  }
  std::vector<uint8_t> hidden(hb), scales(sb);
  int64_t bad_rows = 0;
  for (int64_t row = 0; row < P; ++row) {
    if (!expected_row(row, hidden.data(), scales.data())) continue;
    int64_t bad = differing_units(hidden.data(), &got.hidden[row * hb], hb, compare_unit_bytes(s.recv_hidden_dtype()));
    if (sb) bad += differing_units(scales.data(), &got.scales[row * sb], sb, compare_unit_bytes(s.recv_scale_dtype()));
    if (bad && bad_rows++ < 2) {
      v.add(bad, "payload of receive row " + str(row) + " (source rank " + str(row / s.tokens_per_rank()) +
                     "): " + str(bad) + " elements wrong");
    } else {
      v.add(bad, "");
    }
  }
}

bool same_tokens_per_rank(Verdict& v, int expected, int got) {
  if (got == expected) return true;
  v.add(1, "tokens_per_rank: expected " + str(expected) + ", got " + str(got));
  return false;
}

// The rank-major counts and statistics an expert layout keeps.
void compare_counts(Verdict& v, const ReceivedDispatch& e, const ReceivedDispatch& got) {
  compare_entries(v, "recv_counts", e.recv_counts, got.recv_counts);
  compare_entries(v, "local_expert_counts", e.local_expert_counts, got.local_expert_counts);
  if (e.has_eplb) compare_entries(v, "eplb_gathered_stats", e.eplb_gathered, got.eplb_gathered);
}

}  // namespace

Verdict check_dispatch(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                       const ReceivedDispatch& got) {
  Verdict v;
  if (!same_tokens_per_rank(v, s.tokens_per_rank(), got.tokens_per_rank)) return v;
  const Expected e = expect_receive(s, all, me);
  if (s.expert_layout()) {
    compare_counts(v, e.result, got);
    v.merge(check_expert_dispatch(s, all, me, got));
    return v;
  }
  compare_fields(v, s, e.result, got);
  compare_payload(
      v, s,
      [&](int64_t row, uint8_t* hidden, uint8_t* scales) {
        const int t = e.source_token[row];
        if (t < 0) return false;
        const int src = static_cast<int>(row / s.tokens_per_rank());
        fill_received_row(s, src, t, hidden, scales);
        return true;
      },
      got);
  return v;
}

Verdict compare_dispatch(const WorkloadSpec& s, const ReceivedDispatch& reference, const ReceivedDispatch& got) {
  Verdict v;
  if (!same_tokens_per_rank(v, reference.tokens_per_rank, got.tokens_per_rank)) return v;
  if (s.expert_layout()) {
    compare_counts(v, reference, got);
    v.merge(compare_expert_dispatch(s, reference, got));
    return v;
  }
  compare_fields(v, s, reference, got);
  const uint64_t hb = s.recv_hidden_row_bytes(), sb = s.recv_scale_row_bytes();
  const int64_t tpr = s.tokens_per_rank();
  if (reference.hidden.size() != uint64_t(s.receive_rows()) * hb ||
      reference.scales.size() != uint64_t(s.receive_rows()) * sb) {
    v.add(1, "reference payload of the wrong size");
    return v;
  }
  compare_payload(
      v, s,
      [&](int64_t row, uint8_t* hidden, uint8_t* scales) {
        const int64_t src = row / tpr;
        if (src >= int64_t(reference.recv_counts.size()) || row - src * tpr >= reference.recv_counts[src]) return false;
        std::memcpy(hidden, &reference.hidden[row * hb], hb);
        if (sb) std::memcpy(scales, &reference.scales[row * sb], sb);
        return true;
      },
      got);
  return v;
}

Verdict check_combine(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output) {
  return check_combine(s, all, me, output, [&s](int expert_rank, int64_t row, int, float* out) {
    for (int h = 0; h < s.hidden_size; ++h) out[h] = expert_output_value(s, expert_rank, row, h);
  });
}

Verdict check_combine(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                      const std::vector<uint8_t>& output, const ExpertRowModel& expert_rows) {
  if (s.expert_layout()) return check_expert_combine(s, all, me, output, expert_rows);
  Verdict v;
  const RankRouting& mine = all[me];
  const int H = s.hidden_size, T = mine.num_tokens;
  if (output.size() != size_t(T) * s.combine_row_bytes()) {
    v.add(int64_t(T) * H,
          "output: expected " + str(size_t(T) * s.combine_row_bytes()) + " bytes, got " + str(output.size()));
    return v;
  }
  std::vector<std::vector<int>> sent(s.world);  // sent[r]: my tokens that rank r holds, in row order
  for (int r = 0; r < s.world; ++r) sent[r] = tokens_sent(s, mine, r);
  std::vector<float> acc(H), row_values(H);
  int reported = 0;
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < s.world; ++r) {  // ascending rank order, fp32 accumulation
      const auto at = std::lower_bound(sent[r].begin(), sent[r].end(), t);
      if (at == sent[r].end() || *at != t) continue;
      const int64_t row = int64_t(me) * s.tokens_per_rank() + (at - sent[r].begin());
      expert_rows(r, row, t, row_values.data());
      if (s.fp8_combine()) {
        oracle_wire_round_trip(s.combine_dtype, row_values.data(), H, static_cast<WireScale>(s.wire_scale));
      }
      for (int h = 0; h < H; ++h) acc[h] += row_values[h];
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

}  // namespace moe_ep_verify
