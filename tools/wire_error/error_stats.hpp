// The error of rows against reference rows: per element |a - b| / |b| over
// the elements whose reference is not 0, and per row ||a - b|| / ||b||
// (Euclidean norms), each as a mean and a maximum.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace moe_ep_wire_error {

struct ErrorStats {
  double element_sum = 0, element_max = 0, row_sum = 0, row_max = 0;
  int64_t elements = 0, rows = 0;

  void add_row(const float* got, const float* want, int64_t n) {
    double diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(got[i]) - want[i];
      diff2 += d * d;
      ref2 += static_cast<double>(want[i]) * want[i];
      if (want[i] != 0.0f) {
        const double rel = std::fabs(d) / std::fabs(static_cast<double>(want[i]));
        element_sum += rel;
        element_max = std::max(element_max, rel);
        ++elements;
      }
    }
    if (ref2 > 0) {
      const double rel = std::sqrt(diff2 / ref2);
      row_sum += rel;
      row_max = std::max(row_max, rel);
      ++rows;
    }
  }
  void merge(const ErrorStats& o) {
    element_sum += o.element_sum, row_sum += o.row_sum, elements += o.elements, rows += o.rows;
    element_max = std::max(element_max, o.element_max), row_max = std::max(row_max, o.row_max);
  }
  double element_mean() const { return elements ? element_sum / static_cast<double>(elements) : 0; }
  double row_mean() const { return rows ? row_sum / static_cast<double>(rows) : 0; }
};

}  // namespace moe_ep_wire_error
