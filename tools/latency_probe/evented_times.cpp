#include "evented_times.hpp"

#include <algorithm>

namespace moe_ep_probe {

namespace {

// Empty when every side has the same phases, each with the same iterations.
std::string shape_error(const EventedTimes& times) {
  if (times.us.empty() || times.us[0].empty()) return "no sides or no phases were timed";
  const size_t phases = times.us[0].size();
  const size_t iterations = times.us[0][0].size();
  for (const auto& side : times.us) {
    if (side.size() != phases) return "the sides were timed over different numbers of phases";
    for (const auto& phase : side) {
      if (phase.size() != iterations) return "the sides or phases were timed over different numbers of iterations";
    }
  }
  return "";
}

}  // namespace

Measurement evented_measurement(const std::string& name, const std::string& what, const EventedTimes& times) {
  Measurement m{name, what, {}, times.error, {}};
  if (m.error.empty()) m.error = shape_error(times);
  if (!m.error.empty()) return m;
  const size_t sides = times.us.size();
  const size_t phases = times.us[0].size();
  std::vector<std::vector<double>> per_phase(phases);
  for (size_t p = 0; p < phases; ++p) {
    for (size_t i = 0; i < times.us[0][p].size(); ++i) {
      double slowest = times.us[0][p][i];
      for (size_t s = 1; s < sides; ++s) slowest = std::max(slowest, times.us[s][p][i]);
      per_phase[p].push_back(slowest);
      m.samples_us.push_back(slowest);
    }
  }
  if (sides > 1) {
    for (size_t s = 0; s < sides; ++s) {
      std::vector<double> pooled;
      for (const auto& phase : times.us[s]) pooled.insert(pooled.end(), phase.begin(), phase.end());
      m.extras.emplace_back("side_" + std::string(1, char('a' + s % 26)) + "_median_us", summarize(pooled).median);
    }
  }
  if (phases > 1) {
    for (size_t p = 0; p < phases; ++p) {
      m.extras.emplace_back("phase_" + std::to_string(p + 1) + "_median_us", summarize(per_phase[p]).median);
    }
  }
  m.extras.emplace_back("batches_gate_expired", times.batches_gate_expired);
  return m;
}

}  // namespace moe_ep_probe
