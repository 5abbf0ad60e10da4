#include "expert_layout.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "checked_math.hpp"
#include "dtype.hpp"

namespace moe_ep {

namespace {

size_t size_of(uint64_t n) { return checked_size(n, "expert layout buffer"); }

uint64_t scale_bytes(const Layout& l) {
  if (l.scale_row_elems == 0) return 0;
  if (l.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) {
    return checked_mul(static_cast<uint64_t>(l.expert_scale_elems()), sizeof(float), "expert layout scales");
  }
  return checked_mul(static_cast<uint64_t>(l.expert_layout_rows()), l.scale_row_bytes, "expert layout scales");
}

uint64_t max_picks(const Layout& l) {
  return checked_mul(static_cast<uint64_t>(l.receive_rows(l.max_tokens_per_rank)), static_cast<uint64_t>(l.top_k),
                     "expert layout picks");
}

// The product is rounded to fp32 before it is added: no fused multiply-add,
// whatever the compiler's contraction setting (the oracle and every backend
// round the same way).
float weighted(float weight, float value) {
  volatile float product = weight * value;
  return product;
}

}  // namespace

uint64_t expert_rows_bytes(const Layout& l) {
  const std::string what = "expert layout size";
  const uint64_t rows = static_cast<uint64_t>(l.expert_layout_rows());
  const uint64_t E = static_cast<uint64_t>(l.experts_per_rank());
  uint64_t total = checked_mul(rows, checked_add(l.hidden_row_bytes, 4 * sizeof(int32_t), what), what);
  total = checked_add(total, scale_bytes(l), what);
  total = checked_add(total, checked_mul(2 * E + 2, sizeof(int32_t), what), what);
  return checked_add(total, checked_mul(max_picks(l), sizeof(int32_t), what), what);
}

void allocate_expert_rows(const Layout& l, ExpertRows& r) {
  const uint64_t rows = static_cast<uint64_t>(l.expert_layout_rows());
  r.hidden.resize(size_of(checked_mul(rows, l.hidden_row_bytes, "expert layout rows")));
  r.scales.resize(size_of(scale_bytes(l)));
  r.counts.resize(static_cast<size_t>(l.experts_per_rank()));
  r.offsets.resize(static_cast<size_t>(l.experts_per_rank()) + 1);
  r.sources.resize(size_of(checked_mul(rows, 3, "expert layout sources")));
  r.weights.resize(size_of(rows));
  r.dropped.resize(1);
  r.pick_rows.resize(size_of(max_picks(l)));
}

void expand_to_expert_rows(const Layout& l, const RankMajorReceive& in, ExpertRows& out) {
  const int32_t E = l.experts_per_rank(), K = l.top_k, first = l.rank * E;
  const int32_t tpr = in.tokens_per_rank;
  const int64_t rows = l.expert_layout_rows();
  const bool major = l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR;
  const uint64_t hb = l.hidden_row_bytes, sb = l.scale_row_bytes;
  std::fill(out.hidden.begin(), out.hidden.end(), uint8_t{0});
  std::fill(out.scales.begin(), out.scales.end(), uint8_t{0});  // empty without scales
  std::fill(out.sources.begin(), out.sources.end(), -1);
  std::fill(out.weights.begin(), out.weights.end(), 0.0f);
  std::fill(out.pick_rows.begin(), out.pick_rows.end(), -1);

  // Pairs per local expert, then where each expert's rows start.
  std::vector<int64_t> pairs(static_cast<size_t>(E), 0);
  for (int32_t s = 0; s < l.world_size; ++s) {
    for (int64_t i = int64_t{s} * tpr; i < int64_t{s} * tpr + in.recv_counts[s]; ++i) {
      for (int32_t k = 0; k < K; ++k) {
        const int32_t id = in.topk_ids[i * K + k];
        if (id >= first && id < first + E) ++pairs[static_cast<size_t>(id - first)];
      }
    }
  }
  int64_t dropped = 0, end = 0;
  for (int32_t e = 0; e < E; ++e) {
    int64_t start = 0, room = 0;
    if (major) {
      start = int64_t{e} * l.expert_capacity;
      room = l.expert_capacity;
    } else {
      start = (end + l.expert_alignment - 1) / l.expert_alignment * l.expert_alignment;  // <= expert_rows
      room = rows - start;
    }
    const int64_t count = std::min(pairs[static_cast<size_t>(e)], room);
    out.offsets[static_cast<size_t>(e)] = static_cast<int32_t>(start);
    out.counts[static_cast<size_t>(e)] = static_cast<int32_t>(count);
    dropped += pairs[static_cast<size_t>(e)] - count;
    end = start + count;
  }
  out.offsets[static_cast<size_t>(E)] =
      major ? static_cast<int32_t>(rows)
            : static_cast<int32_t>((end + l.expert_alignment - 1) / l.expert_alignment * l.expert_alignment);
  out.dropped[0] = static_cast<int32_t>(std::min<int64_t>(dropped, INT32_MAX));

  // Fill: rank-major rows are in ascending (source rank, source token) order.
  const int64_t column = major ? scale_column_rows(l.expert_capacity) : scale_column_rows(rows);
  std::vector<int64_t> next(static_cast<size_t>(E), 0);
  for (int32_t s = 0; s < l.world_size; ++s) {
    for (int64_t i = int64_t{s} * tpr; i < int64_t{s} * tpr + in.recv_counts[s]; ++i) {
      for (int32_t k = 0; k < K; ++k) {
        const int32_t id = in.topk_ids[i * K + k];
        if (id < first || id >= first + E) continue;
        const auto e = static_cast<size_t>(id - first);
        if (next[e] >= out.counts[e]) continue;  // did not fit: counted above
        const int64_t within = next[e]++;
        const int64_t row = out.offsets[e] + within;
        out.pick_rows[static_cast<size_t>(i * K + k)] = static_cast<int32_t>(row);
        out.sources[static_cast<size_t>(row * 3)] = s;
        out.sources[static_cast<size_t>(row * 3 + 1)] = in.source_tokens[i];
        out.sources[static_cast<size_t>(row * 3 + 2)] = k;
        out.weights[static_cast<size_t>(row)] = in.topk_weights ? in.topk_weights[i * K + k] : 1.0f;
        std::memcpy(out.hidden.data() + row * hb, in.hidden + i * hb, hb);
        if (sb == 0 || in.scales == nullptr) continue;
        if (l.scale_layout == MOE_EP_SCALES_ROW_MAJOR) {
          std::memcpy(out.scales.data() + row * sb, in.scales + i * sb, sb);
          continue;
        }
        // Column-major fp32: element j of the row goes to column j.
        auto* columns = reinterpret_cast<float*>(out.scales.data());
        const int64_t base = major ? int64_t(e) * l.scale_row_elems * column : 0;
        const int64_t at = major ? within : row;
        for (int32_t j = 0; j < l.scale_row_elems; ++j) {
          std::memcpy(&columns[base + int64_t{j} * column + at], in.scales + i * sb + j * sizeof(float), sizeof(float));
        }
      }
    }
  }
}

void reduce_expert_rows(const Layout& l, const RankMajorReceive& in, const ExpertRows& rows,
                        const uint8_t* expert_output, uint8_t* rank_major_out) {
  const int32_t K = l.top_k, H = l.hidden_size;
  const uint64_t cb = l.combine_row_bytes;
  std::vector<float> acc(static_cast<size_t>(H));
  std::vector<std::pair<int32_t, int32_t>> picks;  // (expert id, pick) of one token
  for (int32_t s = 0; s < l.world_size; ++s) {
    const int64_t begin = int64_t{s} * in.tokens_per_rank;
    for (int64_t i = begin; i < begin + in.recv_counts[s]; ++i) {
      picks.clear();
      for (int32_t k = 0; k < K; ++k) {
        if (rows.pick_rows[static_cast<size_t>(i * K + k)] >= 0) picks.emplace_back(in.topk_ids[i * K + k], k);
      }
      std::sort(picks.begin(), picks.end());  // ascending local expert, then pick
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (const auto& pick : picks) {
        const int64_t row = rows.pick_rows[static_cast<size_t>(i * K + pick.second)];
        const uint8_t* src = expert_output + row * cb;
        const float w = rows.weights[static_cast<size_t>(row)];
        for (int32_t h = 0; h < H; ++h) {
          const float x = load_as_float(l.combine_dtype, src, h);
          acc[static_cast<size_t>(h)] += l.expert_output_weighted ? x : weighted(w, x);
        }
      }
      uint8_t* dst = rank_major_out + i * cb;
      for (int32_t h = 0; h < H; ++h) store_from_float(l.combine_dtype, dst, h, acc[static_cast<size_t>(h)]);
    }
  }
}

}  // namespace moe_ep
