#include "nccl/nccl_chunk_plan.hpp"

#include <algorithm>

namespace moe_ep {

NcclChunkPlan plan_nccl_chunks(int32_t tokens_per_rank, int32_t chunks) {
  NcclChunkPlan plan;
  const int64_t tpr = std::max<int64_t>(tokens_per_rank, 0);
  if (tpr == 0) {
    plan.count = 1;
    plan.ranges[0] = NcclRowRange{0, 0};
    return plan;
  }
  const int64_t n = std::min(std::clamp<int64_t>(chunks, 1, kMaxNcclChunks), tpr);
  // (c + 1) * tpr cannot overflow: c < 16 and tpr, a tokens_per_rank, fits 32 bits.
  for (int64_t c = 0; c < n; ++c) {
    const int64_t first = c * tpr / n, next = (c + 1) * tpr / n;
    plan.ranges[c] = NcclRowRange{first, next - first};
  }
  plan.count = static_cast<int32_t>(n);
  return plan;
}

NcclTokenRange nccl_tokens_complete_after(const NcclChunkPlan& plan, int32_t i, int32_t num_tokens) {
  const NcclRowRange& r = plan.ranges[i];
  const int64_t tokens = std::max<int32_t>(num_tokens, 0);
  const int64_t begin = std::min(r.first, tokens);
  const int64_t end = i + 1 == plan.count ? tokens : std::min(r.first + r.rows, tokens);
  return NcclTokenRange{static_cast<int32_t>(begin), static_cast<int32_t>(std::max(begin, end))};
}

}  // namespace moe_ep
