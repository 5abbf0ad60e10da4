#include "collective_step.hpp"

namespace moe_ep {

void check_same_on_every_rank(const Exchange& exchange, const std::vector<RankValue>& mine, const char* step) {
  const size_t n = mine.size();
  std::vector<int32_t> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = mine[i].value;
  const int32_t world = exchange.world_size();
  std::vector<int32_t> all(n * static_cast<size_t>(world));
  if (n != 0) exchange.allgather(values.data(), all.data(), n * sizeof(int32_t), step);
  for (int32_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t first = all[i];
      const int32_t theirs = all[static_cast<size_t>(r) * n + i];
      if (theirs != first) {
        fail(MOE_EP_ERROR_INVALID_ARGUMENT, mine[i].name, ": expected the same value on every rank, got ", first,
             " on rank 0 and ", theirs, " on rank ", r);
      }
    }
  }
}

}  // namespace moe_ep
