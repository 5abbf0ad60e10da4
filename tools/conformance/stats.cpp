#include "stats.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace moe_ep_tool {

namespace {
double percentile(const std::vector<double>& sorted, double p) {
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}
}  // namespace

Stats stats_of(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.avg = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  s.p50 = percentile(v, 50);
  s.p99 = percentile(v, 99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

std::vector<double> sum_each(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(std::min(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

PhaseTiming reduce_phase(const World& world, const std::vector<double>& iteration_us) {
  PhaseTiming t;
  // The step a model takes ends when its slowest rank is done.
  t.step = stats_of(world.max_each(iteration_us));
  const Stats mine = stats_of(iteration_us);
  t.rank_avg = world.allgather(mine.avg);
  const std::vector<double> rank_p50 = world.allgather(mine.p50);
  t.rank_max_p50 = *std::max_element(rank_p50.begin(), rank_p50.end());
  const auto [lo, hi] = std::minmax_element(t.rank_avg.begin(), t.rank_avg.end());
  t.rank_min = *lo;
  t.rank_max = *hi;
  t.rank_argmin = int(lo - t.rank_avg.begin());
  t.rank_argmax = int(hi - t.rank_avg.begin());
  return t;
}

}  // namespace moe_ep_tool
