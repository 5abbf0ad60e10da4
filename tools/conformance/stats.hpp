// Latency statistics over iterations and over ranks.
#pragma once

#include <vector>

#include "mpi_world.hpp"

namespace moe_ep_tool {

struct Stats {
  double avg = 0, p50 = 0, p99 = 0, min = 0, max = 0;
};

// Nearest-rank percentiles over the values (empty: all zero).
Stats stats_of(std::vector<double> values);

// One phase (dispatch, say) timed over the same iterations on every rank.
struct PhaseTiming {
  Stats step;                     // over iterations of the slowest rank's time in that iteration
  std::vector<double> rank_avg;   // each rank's own average
  double rank_min = 0, rank_max = 0;
  double rank_max_p50 = 0;  // max over ranks of each rank's own median (per-rank view of p50)
  int rank_argmin = 0, rank_argmax = 0;
};

// a[i] + b[i] for each iteration: the time of two phases together.
std::vector<double> sum_each(const std::vector<double>& a, const std::vector<double>& b);

// Collective: every rank passes its per-iteration times (same count).
PhaseTiming reduce_phase(const World& world, const std::vector<double>& iteration_us);

}  // namespace moe_ep_tool
