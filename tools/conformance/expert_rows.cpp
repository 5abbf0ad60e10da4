#include "expert_rows.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "dtypes.hpp"
#include "expert_oracle.hpp"

namespace moe_ep_tool {

namespace {

// Runs fn(i) for i in [0, n) on up to the machine's cores (each i on one thread).
template <typename Fn>
void parallel_for(int64_t n, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) fn(i);
    });
  }
  for (std::thread& th : pool) th.join();
}

// Element j of expert row `row`'s scales as the layout stores them (the row's
// bytes, or its fp32 columns), as the oracle reads them.
void scales_of_row(const WorkloadSpec& s, const std::vector<uint8_t>& scales, int64_t row, std::vector<uint8_t>& out) {
  out.clear();
  if (s.scale_layout == MOE_EP_SCALES_ROW_MAJOR) {
    const uint64_t sb = s.recv_scale_row_bytes();
    out.insert(out.end(), scales.begin() + int64_t(row * sb), scales.begin() + int64_t((row + 1) * sb));
    return;
  }
  for (int j = 0; j < s.recv_scale_row_elems(); ++j) {
    const int64_t at = column_scale_index(s, row, j);
    out.insert(out.end(), scales.begin() + at * 4, scales.begin() + at * 4 + 4);
  }
}

uint64_t expected_scale_bytes(const WorkloadSpec& s) {
  if (!s.recv_scale_row_elems()) return 0;
  if (s.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) return uint64_t(column_scale_elems(s)) * sizeof(float);
  return uint64_t(s.expert_layout_rows()) * s.recv_scale_row_bytes();
}

}  // namespace

void write_expert_layout_output(const WorkloadSpec& s, int rank, const std::vector<RankRouting>& all,
                                const Place& place, void* target, void* stream) {
  const uint64_t rb = s.combine_row_bytes();
  const int H = s.hidden_size;
  // All-ones bytes: NaN in bf16, fp16 and fp32 (the combine dtypes).
  fill_at(place, target, uint64_t(s.combine_rows()) * rb, 0xFF, stream);
  const ExpertPlacement p = place_expert_rows(s, all, rank);
  const int experts = s.experts_per_rank();
  std::vector<uint64_t> first(size_t(experts) + 1, 0);  // where each expert's pair rows start in `rows`
  for (int e = 0; e < experts; ++e) first[size_t(e) + 1] = first[size_t(e)] + uint64_t(p.counts[size_t(e)]);
  std::vector<uint8_t> rows(first[size_t(experts)] * rb);
  parallel_for(experts, [&](int64_t e) {
    for (int64_t j = 0; j < p.counts[size_t(e)]; ++j) {
      const int64_t row = int64_t(p.offsets[size_t(e)]) + j;
      uint8_t* out = rows.data() + (first[size_t(e)] + uint64_t(j)) * rb;
      for (int h = 0; h < H; ++h) store_float(s.combine_dtype, out, h, expert_output_value(s, rank, row, h));
    }
  });
  for (int e = 0; e < experts; ++e) {
    const uint64_t n = uint64_t(p.counts[size_t(e)]);
    if (n == 0) continue;
    upload_at(place, static_cast<char*>(target) + uint64_t(p.offsets[size_t(e)]) * rb,
              rows.data() + first[size_t(e)] * rb, n * rb, stream);
  }
}

Verdict check_expert_layout_dispatch(const WorkloadSpec& s, const std::vector<RankRouting>& all, int me,
                                     const moe_ep_dispatch_result_t& r, const Place& place, void* stream) {
  Verdict v;
  const MemoryReader read = reader(place, stream);
  if (s.eplb_stats) {  // not a workload of the bench: the oracle's own path
    const ReceivedDispatch got = read_dispatch(s, r, place.dlpack(), read, v);
    v.merge(check_dispatch(s, all, me, got));
    return v;
  }
  // Every view's shape, dtype and device as read_dispatch checks them, and
  // every tensor but the payload rows read whole.
  const char* hidden =
      r.hidden_states.data ? static_cast<const char*>(r.hidden_states.data) + r.hidden_states.byte_offset : nullptr;
  bool hidden_as_expected = false;  // read_dispatch found its view as specified (and asked to read it)
  const ReceivedDispatch got = read_dispatch(
      s, r, place.dlpack(),
      [&](const void* data, uint64_t bytes) {
        if (hidden != nullptr && data == hidden && !hidden_as_expected) {
          hidden_as_expected = true;
          return std::vector<uint8_t>();
        }
        return read(data, bytes);
      },
      v);
  if (got.tokens_per_rank != s.tokens_per_rank()) {
    v.add(1, "tokens_per_rank: expected " + std::to_string(s.tokens_per_rank()) + ", got " +
                 std::to_string(got.tokens_per_rank));
    return v;
  }
  // The rank-major counts an expert layout keeps.
  const int E = s.experts_per_rank();
  std::vector<int32_t> recv_counts(size_t(s.world), 0), local_counts(size_t(E), 0);
  for (int src = 0; src < s.world; ++src) {
    const RankRouting& in = all[size_t(src)];
    for (int t = 0; t < in.num_tokens; ++t) recv_counts[size_t(src)] += goes_to(s, in, t, me) ? 1 : 0;
    for (int32_t id : in.topk_ids) {
      if (s.owner(id) == me) ++local_counts[size_t(id - me * E)];
    }
  }
  compare_entries(v, "recv_counts", recv_counts, got.recv_counts);
  compare_entries(v, "local_expert_counts", local_counts, got.local_expert_counts);
  // Counts, offsets, sources and weights of every row, padding included.
  const ExpertPlacement p = place_expert_rows(s, all, me);
  check_expert_fields(v, s, p, got);
  if (!hidden_as_expected) return v;  // its view is wrong: counted by read_dispatch
  const int64_t rows = s.expert_layout_rows();
  if (s.recv_scale_row_elems() && got.scales.size() != expected_scale_bytes(s)) {
    v.add(std::max<int64_t>(rows, 1), "hidden_states_scale: expected " + std::to_string(expected_scale_bytes(s)) +
                                          " bytes, got " + std::to_string(got.scales.size()));
    return v;
  }
  // The payload of the pair rows, one expert's rows (contiguous) at a time.
  const uint64_t hb = s.recv_hidden_row_bytes();
  std::vector<uint8_t> want(hb), want_scales(s.recv_scale_row_bytes()), have_scales;
  int64_t bad_rows = 0;
  for (int e = 0; e < E; ++e) {
    const int64_t first = p.offsets[size_t(e)], n = p.counts[size_t(e)];
    if (n == 0) continue;
    const std::vector<uint8_t> have = read(hidden + uint64_t(first) * hb, uint64_t(n) * hb);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t row = first + j;
      const int src = p.sources[size_t(row) * 3], token = p.sources[size_t(row) * 3 + 1];
      fill_received_row(s, src, token, want.data(), want_scales.data());
      int64_t bad = std::memcmp(want.data(), &have[size_t(j) * hb], hb) != 0;
      if (s.recv_scale_row_elems()) {
        scales_of_row(s, got.scales, row, have_scales);
        bad += want_scales != have_scales;
      }
      if (bad && bad_rows++ < 2) {
        v.add(bad, "payload of expert row " + std::to_string(row) + " (source rank " + std::to_string(src) +
                       ", token " + std::to_string(token) + ") wrong");
      } else {
        v.add(bad, "");
      }
    }
  }
  return v;
}

}  // namespace moe_ep_tool
