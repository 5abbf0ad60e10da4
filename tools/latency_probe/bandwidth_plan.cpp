#include "bandwidth_plan.hpp"

#include <algorithm>

namespace moe_ep_probe {

std::vector<int> bandwidth_grids(int sm_count) {
  std::vector<int> grids;
  if (sm_count < 1) return grids;
  for (int g : {1, 4, 8, 16, 24}) {
    if (g < sm_count) grids.push_back(g);
  }
  grids.push_back(sm_count);
  return grids;
}

size_t bandwidth_slice_bytes(int blocks, size_t per_block, size_t per_kernel, size_t granule) {
  if (blocks < 1 || granule == 0) return 0;
  const size_t n = static_cast<size_t>(blocks);
  // min(n x per_block, per_kernel) / n without overflowing n x per_block.
  const size_t share = per_block <= per_kernel / n ? per_block : per_kernel / n;
  return share / granule * granule;
}

double gigabytes_per_second(double bytes, double ms) {
  if (!(ms > 0)) return 0;
  return bytes / (ms * 1e-3) / 1e9;
}

}  // namespace moe_ep_probe
