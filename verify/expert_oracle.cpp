// The oracle of the expert layouts (docs/semantics.md, "Receive layouts"):
// where each pick lands, what each expert row holds, and the weighted
// combine, from every rank's regenerated routing.  Independent of the
// library's expansion (src/expert_layout.cpp): that one walks the rank-major
// receive rows; this one filters every source's picks per expert.
#include <algorithm>
#include <cstring>
#include <sstream>

#include "dtypes.hpp"
#include "expert_oracle.hpp"
#include "wire_oracle.hpp"

namespace moe_ep_verify {

namespace {

template <typename T>
std::string str(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

// A product rounded to fp32 before it is added (no fused multiply-add).
float rounded_product(float a, float b) {
  volatile float p = a * b;
  return p;
}

// Bytes of the expert layout's scale tensor.
uint64_t scale_bytes(const WorkloadSpec& s) {
  if (!s.recv_scale_row_elems()) return 0;
  if (s.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) return uint64_t(column_scale_elems(s)) * sizeof(float);
  return uint64_t(s.expert_layout_rows()) * s.recv_scale_row_bytes();
}

// Element j of expert row `row`'s scales, as the layout stores it (fp32
// columns), or the row's bytes (row-major): appended to `out`.
void scale_of_row(const WorkloadSpec& s, const std::vector<uint8_t>& scales, int64_t row, std::vector<uint8_t>& out) {
  out.clear();
  if (s.scale_layout == MOE_EP_SCALES_ROW_MAJOR) {
    const uint64_t sb = s.recv_scale_row_bytes();
    out.insert(out.end(), scales.begin() + row * sb, scales.begin() + (row + 1) * sb);
    return;
  }
  for (int j = 0; j < s.recv_scale_row_elems(); ++j) {
    const int64_t at = column_scale_index(s, row, j);
    out.insert(out.end(), scales.begin() + at * 4, scales.begin() + at * 4 + 4);
  }
}

}  // namespace

int64_t column_scale_elems(const WorkloadSpec& s) {
  if (s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    return int64_t(s.experts_per_rank()) * s.recv_scale_row_elems() * align_up(s.capacity(), 4);
  }
  return int64_t(s.recv_scale_row_elems()) * align_up(s.packed_rows(), 4);
}

int64_t column_scale_index(const WorkloadSpec& s, int64_t row, int j) {
  if (s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    const int64_t e = row / s.capacity(), within = row % s.capacity();
    return (e * s.recv_scale_row_elems() + j) * align_up(s.capacity(), 4) + within;
  }
  return int64_t(j) * align_up(s.packed_rows(), 4) + row;
}

ExpertPlacement place_expert_rows(const WorkloadSpec& s, const std::vector<RankRouting>& all, int dest) {
  const int E = s.experts_per_rank(), K = s.top_k;
  const int64_t rows = s.expert_layout_rows();
  ExpertPlacement p;
  p.counts.assign(E, 0);
  p.offsets.assign(E + 1, 0);
  p.sources.assign(rows * 3, -1);
  p.weights.assign(rows, 0.0f);
  p.row_of.resize(s.world);
  for (int src = 0; src < s.world; ++src) p.row_of[src].assign(size_t(all[src].num_tokens) * K, -1);
  int64_t used = 0;  // EXPERT_PACKED: rows taken by the experts before
  for (int e = 0; e < E; ++e) {
    const int32_t id = dest * E + e;
    struct Pick {
      int src, token, k;
    };
    std::vector<Pick> picks;  // in ascending (source rank, token, pick) order by construction
    for (int src = 0; src < s.world; ++src) {
      for (int t = 0; t < all[src].num_tokens; ++t) {
        for (int k = 0; k < K; ++k) {
          if (all[src].topk_ids[size_t(t) * K + k] == id) picks.push_back({src, t, k});
        }
      }
    }
    int64_t first_row = 0, room = 0;
    if (s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
      first_row = int64_t(e) * s.capacity();
      room = s.capacity();
    } else {
      first_row = align_up(used, s.alignment());
      room = rows - first_row;
    }
    const int64_t kept = std::min<int64_t>(int64_t(picks.size()), room);
    p.offsets[e] = int32_t(first_row);
    p.counts[e] = int32_t(kept);
    p.dropped += int64_t(picks.size()) - kept;
    used = first_row + kept;
    for (int64_t j = 0; j < kept; ++j) {
      const Pick& q = picks[size_t(j)];
      const int64_t row = first_row + j;
      p.sources[row * 3] = q.src;
      p.sources[row * 3 + 1] = q.token;
      p.sources[row * 3 + 2] = q.k;
      p.weights[row] = s.weights ? all[q.src].topk_weights[size_t(q.token) * K + q.k] : 1.0f;
      p.row_of[q.src][size_t(q.token) * K + q.k] = row;
    }
  }
  p.offsets[E] =
      s.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR ? int32_t(rows) : int32_t(align_up(used, s.alignment()));
  return p;
}

void check_expert_fields(Verdict& v, const WorkloadSpec& s, const ExpertPlacement& p, const ReceivedDispatch& got) {
  compare_entries(v, "expert_counts", p.counts, got.expert_counts);
  if (s.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED)
    compare_entries(v, "expert_offsets", p.offsets, got.expert_offsets);
  compare_entries(v, "row_sources", p.sources, got.row_sources);
  compare_entries(v, "row_weights", p.weights, got.row_weights);
  compare_entries(v, "dropped_pairs", {int32_t(std::min<int64_t>(p.dropped, INT32_MAX))}, got.dropped_pairs);
  if (!got.topk_ids.empty() || got.has_weights) v.add(1, "topk_ids/topk_weights: returned in an expert layout");
}

void compare_expert_payload(Verdict& v, const WorkloadSpec& s, const std::vector<int32_t>& sources,
                            const ExpertRowBytes& expected_row, const ReceivedDispatch& got) {
  const uint64_t hb = s.recv_hidden_row_bytes();
  const int64_t rows = s.expert_layout_rows();
  if (got.hidden.size() != uint64_t(rows) * hb) {
    v.add(std::max<int64_t>(rows, 1),
          "hidden_states: expected " + str(uint64_t(rows) * hb) + " bytes, got " + str(got.hidden.size()));
    return;
  }
  if (s.recv_scale_row_elems() && got.scales.size() != scale_bytes(s)) {
    v.add(std::max<int64_t>(rows, 1),
          "hidden_states_scale: expected " + str(scale_bytes(s)) + " bytes, got " + str(got.scales.size()));
    return;
  }
  std::vector<uint8_t> hidden(hb), scales, got_scales;
  int64_t bad_rows = 0;
  for (int64_t row = 0; row < rows; ++row) {
    if (sources[size_t(row) * 3] < 0) continue;  // padding: unspecified payload
    expected_row(row, sources[size_t(row) * 3], sources[size_t(row) * 3 + 1], hidden, scales);
    int64_t bad = std::memcmp(hidden.data(), &got.hidden[size_t(row) * hb], hb) != 0;
    if (s.recv_scale_row_elems()) {
      scale_of_row(s, got.scales, row, got_scales);
      bad += scales != got_scales;
    }
    if (bad && bad_rows++ < 2) {
      v.add(bad, "payload of expert row " + str(row) + " (source rank " + str(sources[size_t(row) * 3]) + ", token " +
                     str(sources[size_t(row) * 3 + 1]) + ") wrong");
    } else {
      v.add(bad, "");
    }
  }
}

Verdict check_expert_dispatch(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                              const ReceivedDispatch& got) {
  Verdict v;
  const ExpertPlacement p = place_expert_rows(s, all, me);
  check_expert_fields(v, s, p, got);
  compare_expert_payload(
      v, s, p.sources,
      [&](int64_t, int src, int token, std::vector<uint8_t>& hidden, std::vector<uint8_t>& scales) {
        std::vector<uint8_t> row(s.recv_scale_row_bytes());
        fill_received_row(s, src, token, hidden.data(), row.data());
        if (!s.recv_scale_row_elems()) return;
        scales = row;  // row-major: the row; column-major fp32: the same S elements in order
      },
      got);
  return v;
}

Verdict compare_expert_dispatch(const WorkloadSpec& s, const ReceivedDispatch& ref, const ReceivedDispatch& got) {
  Verdict v;
  compare_entries(v, "expert_counts", ref.expert_counts, got.expert_counts);
  compare_entries(v, "expert_offsets", ref.expert_offsets, got.expert_offsets);
  compare_entries(v, "row_sources", ref.row_sources, got.row_sources);
  compare_entries(v, "row_weights", ref.row_weights, got.row_weights);
  compare_entries(v, "dropped_pairs", ref.dropped_pairs, got.dropped_pairs);
  if (ref.row_sources.size() != size_t(s.expert_layout_rows()) * 3 ||
      ref.hidden.size() != size_t(s.expert_layout_rows()) * s.recv_hidden_row_bytes()) {
    v.add(1, "reference expert rows of the wrong size");
    return v;
  }
  const uint64_t hb = s.recv_hidden_row_bytes();
  compare_expert_payload(
      v, s, ref.row_sources,
      [&](int64_t row, int, int, std::vector<uint8_t>& hidden, std::vector<uint8_t>& scales) {
        std::memcpy(hidden.data(), &ref.hidden[size_t(row) * hb], hb);
        if (s.recv_scale_row_elems()) scale_of_row(s, ref.scales, row, scales);
      },
      got);
  return v;
}

Verdict check_expert_combine(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                             const std::vector<uint8_t>& output, const ExpertRowModel& expert_rows) {
  Verdict v;
  const RankRouting& mine = all[me];
  const int H = s.hidden_size, T = mine.num_tokens, K = s.top_k, E = s.experts_per_rank();
  if (output.size() != size_t(T) * s.combine_row_bytes()) {
    v.add(std::max<int64_t>(int64_t(T) * H, 1),
          "output: expected " + str(size_t(T) * s.combine_row_bytes()) + " bytes, got " + str(output.size()));
    return v;
  }
  std::vector<ExpertPlacement> placed;
  for (int r = 0; r < s.world; ++r) placed.push_back(place_expert_rows(s, all, r));
  std::vector<float> acc(H), partial(H), values(H);
  int reported = 0;
  for (int t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < s.world; ++r) {  // ascending rank order
      if (!goes_to(s, mine, t, r)) continue;
      std::fill(partial.begin(), partial.end(), 0.0f);
      for (int e = 0; e < E; ++e) {  // ascending local expert, then pick
        for (int k = 0; k < K; ++k) {
          if (mine.topk_ids[size_t(t) * K + k] != r * E + e) continue;
          const int64_t row = placed[r].row_of[me][size_t(t) * K + k];
          if (row < 0) continue;  // dropped at dispatch
          expert_rows(r, row, t, values.data());
          const float w = placed[r].weights[size_t(row)];
          for (int h = 0; h < H; ++h)
            partial[h] += s.expert_output_weighted ? values[h] : rounded_product(w, values[h]);
        }
      }
      for (int h = 0; h < H; ++h) {  // the partial travels as one combine_dtype row
        uint32_t bits[1];
        store_float(s.combine_dtype, bits, 0, partial[h]);
        partial[h] = load_float(s.combine_dtype, bits, 0);
      }
      if (s.fp8_combine()) {  // ... quantized on the wire, dequantized to fp32
        oracle_wire_round_trip(s.combine_dtype, partial.data(), H, static_cast<WireScale>(s.wire_scale));
      }
      for (int h = 0; h < H; ++h) acc[h] += partial[h];
    }
    int64_t bad = 0;
    int first = -1;
    float first_want = 0;
    for (int h = 0; h < H; ++h) {
      uint32_t bits[1];
      store_float(s.combine_dtype, bits, 0, acc[h]);
      const float want = load_float(s.combine_dtype, bits, 0);
      const float have = load_float(s.combine_dtype, output.data(), int64_t(t) * H + h);
      if (!(have == want) && bad++ == 0) {
        first = h;
        first_want = want;
      }
    }
    if (bad && reported++ < 2) {
      v.add(bad, "combine output token " + str(t) + ": " + str(bad) + " elements wrong, first [" + str(first) +
                     "] expected " + str(first_want) + " got " +
                     str(load_float(s.combine_dtype, output.data(), int64_t(t) * H + first)));
    } else {
      v.add(bad, "");
    }
  }
  return v;
}

}  // namespace moe_ep_verify
