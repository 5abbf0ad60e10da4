#include "reference_model.hpp"

#include <cstring>

#include "dtype.hpp"

namespace moe_ep {

bool token_goes_to(const Layout& layout, const int32_t* ids_row, int32_t dest) {
  for (int32_t k = 0; k < layout.top_k; ++k) {
    const int32_t id = ids_row[k];
    if (layout.is_valid_expert(id) && layout.owner_of(id) == dest) return true;
  }
  return false;
}

std::vector<int32_t> destination_slots(const Layout& layout, int32_t num_tokens,
                                       const int32_t* topk_ids) {
  const int32_t world = layout.world_size;
  std::vector<int32_t> slots(static_cast<size_t>(num_tokens) * world, -1);
  std::vector<int32_t> next(world, 0);
  // Ascending token order within each destination: the slot is a running count.
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (int32_t d = 0; d < world; ++d) {
      if (token_goes_to(layout, topk_ids + static_cast<int64_t>(t) * layout.top_k, d)) {
        slots[static_cast<size_t>(t) * world + d] = next[d]++;
      }
    }
  }
  return slots;
}

int64_t count_bad_ids(const Layout& layout, int32_t num_tokens, const int32_t* topk_ids,
                      int32_t* first_token, int32_t* first_pick) {
  int64_t bad = 0;
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (int32_t k = 0; k < layout.top_k; ++k) {
      const int32_t id = topk_ids[static_cast<int64_t>(t) * layout.top_k + k];
      if (!layout.is_valid_expert(id) && id != layout.invalid_expert_id) {
        if (bad == 0) {
          if (first_token) *first_token = t;
          if (first_pick) *first_pick = k;
        }
        ++bad;
      }
    }
  }
  return bad;
}

void reference_receive(const Layout& layout, int32_t tpr, const std::vector<SourceTokens>& sources,
                       const ReceiveBuffers& out) {
  const int32_t me = layout.rank;
  const int32_t K = layout.top_k;
  const int64_t rows = layout.receive_rows(tpr);
  // Start from all-padding, then overwrite the rows that carry a token.
  for (int64_t i = 0; i < rows * K; ++i) out.topk_ids[i] = layout.invalid_expert_id;
  if (out.topk_weights) std::memset(out.topk_weights, 0, sizeof(float) * rows * K);
  std::memset(out.hidden, 0, layout.hidden_row_bytes * rows);
  if (out.scales) std::memset(out.scales, 0, layout.scale_row_bytes * rows);
  std::memset(out.local_expert_counts, 0, sizeof(int32_t) * layout.experts_per_rank());

  for (int32_t s = 0; s < layout.world_size; ++s) {
    const SourceTokens& src = sources[s];
    int32_t slot = 0;
    for (int32_t t = 0; t < src.num_tokens; ++t) {
      const int32_t* ids = src.topk_ids + static_cast<int64_t>(t) * K;
      if (!token_goes_to(layout, ids, me)) continue;
      const int64_t row = static_cast<int64_t>(s) * tpr + slot++;
      for (int32_t k = 0; k < K; ++k) {
        const bool mine = layout.is_valid_expert(ids[k]) && layout.owner_of(ids[k]) == me;
        out.topk_ids[row * K + k] = mine ? ids[k] : layout.invalid_expert_id;
        if (mine) ++out.local_expert_counts[ids[k] - me * layout.experts_per_rank()];
        if (out.topk_weights) {
          out.topk_weights[row * K + k] =
              src.topk_weights ? src.topk_weights[static_cast<int64_t>(t) * K + k] : 0.0f;
        }
      }
      std::memcpy(out.hidden + row * layout.hidden_row_bytes,
                  src.hidden + static_cast<int64_t>(t) * layout.hidden_row_bytes,
                  layout.hidden_row_bytes);
      if (out.scales && src.scales) {
        std::memcpy(out.scales + row * layout.scale_row_bytes,
                    src.scales + static_cast<int64_t>(t) * layout.scale_row_bytes,
                    layout.scale_row_bytes);
      }
    }
    out.recv_counts[s] = slot;
  }
}

std::vector<int32_t> count_picks_per_expert(const Layout& layout, int32_t num_tokens,
                                            const int32_t* topk_ids) {
  std::vector<int32_t> counts(layout.num_experts, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(num_tokens) * layout.top_k; ++i) {
    if (layout.is_valid_expert(topk_ids[i])) ++counts[topk_ids[i]];
  }
  return counts;
}

void reference_combine(const Layout& layout, int32_t tpr, int32_t num_tokens,
                       const int32_t* topk_ids, const std::vector<const uint8_t*>& expert_outputs,
                       uint8_t* output) {
  const int32_t world = layout.world_size;
  const int32_t H = layout.hidden_size;
  const std::vector<int32_t> slots = destination_slots(layout, num_tokens, topk_ids);
  std::vector<float> acc(H);
  for (int32_t t = 0; t < num_tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int32_t r = 0; r < world; ++r) {  // ascending rank order: reproducible sums
      const int32_t slot = slots[static_cast<size_t>(t) * world + r];
      if (slot < 0) continue;
      const int64_t row = static_cast<int64_t>(layout.rank) * tpr + slot;
      const uint8_t* src = expert_outputs[r] + row * layout.combine_row_bytes;
      for (int32_t h = 0; h < H; ++h) acc[h] += load_as_float(layout.combine_dtype, src, h);
    }
    uint8_t* dst = output + static_cast<int64_t>(t) * layout.combine_row_bytes;
    for (int32_t h = 0; h < H; ++h) store_from_float(layout.combine_dtype, dst, h, acc[h]);
  }
}

}  // namespace moe_ep
