// The semantics of dispatch and combine (docs/semantics.md §4) as plain host functions over
// the inputs of every rank.  The HOST backend runs them after gathering its
// peers' inputs; written for clarity, not speed.
#pragma once

#include <cstdint>
#include <vector>

#include "params.hpp"

namespace moe_ep {

// What one source rank passed to dispatch.
struct SourceTokens {
  int32_t num_tokens = 0;
  const int32_t* topk_ids = nullptr;    // [T, top_k]
  const float* topk_weights = nullptr;  // [T, top_k] or NULL (forwarded as 0)
  const uint8_t* hidden = nullptr;      // [T, hidden_row_bytes]
  const uint8_t* scales = nullptr;      // [T, scale_row_bytes] or NULL
};

// Receive buffers of one destination rank (layout.rank), world*tpr rows each.
struct ReceiveBuffers {
  uint8_t* hidden = nullptr;
  int32_t* topk_ids = nullptr;
  float* topk_weights = nullptr;  // may be NULL
  uint8_t* scales = nullptr;      // may be NULL
  int32_t* recv_counts = nullptr;          // [world]
  int32_t* local_expert_counts = nullptr;  // [experts_per_rank]
};

// True if any pick of this token is a valid expert owned by `dest`.
bool token_goes_to(const Layout& layout, const int32_t* ids_row, int32_t dest);

// For every token of a source, its receive slot on every rank, or -1 if it is
// not sent there: slots[t * world + dest].  Depends on the source's ids only.
std::vector<int32_t> destination_slots(const Layout& layout, int32_t num_tokens,
                                       const int32_t* topk_ids);

// Number of picks that are neither a valid expert nor the invalid id; the
// first such (token, pick) is reported through first_token/first_pick.
int64_t count_bad_ids(const Layout& layout, int32_t num_tokens, const int32_t* topk_ids,
                      int32_t* first_token, int32_t* first_pick);

// Fills the receive buffers of rank layout.rank from every source rank's input.
// Padding rows: ids = invalid id, weights = 0, hidden and scales zeroed.
void reference_receive(const Layout& layout, int32_t tokens_per_rank,
                       const std::vector<SourceTokens>& sources, const ReceiveBuffers& out);

// Valid picks per expert of one rank's topk_ids: the default EPLB local stats.
std::vector<int32_t> count_picks_per_expert(const Layout& layout, int32_t num_tokens,
                                            const int32_t* topk_ids);

// Combine for source rank layout.rank: out[t] = sum over ranks r ascending of
// expert_outputs[r][slot row], accumulated in fp32, stored as combine_dtype.
// expert_outputs[r] is rank r's [world*tpr, combine_row_bytes] buffer.
void reference_combine(const Layout& layout, int32_t tokens_per_rank, int32_t num_tokens,
                       const int32_t* topk_ids, const std::vector<const uint8_t*>& expert_outputs,
                       uint8_t* output);

}  // namespace moe_ep
