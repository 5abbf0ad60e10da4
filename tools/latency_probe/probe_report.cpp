#include "probe_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace moe_ep_probe {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  q = std::min(1.0, std::max(0.0, q));
  const double pos = q * double(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - double(lo));
}

Summary summarize(std::vector<double> samples) {
  Summary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.count = samples.size();
  s.median = percentile_sorted(samples, 0.5);
  s.p10 = percentile_sorted(samples, 0.1);
  s.p90 = percentile_sorted(samples, 0.9);
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / double(samples.size());
  s.min = samples.front();
  s.max = samples.back();
  return s;
}

namespace {

std::string fixed(double v, int decimals) {
  if (!std::isfinite(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string pad(std::string s, size_t width, bool right) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

}  // namespace

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

void print_table(std::ostream& out, const RunInfo& info, const std::vector<Measurement>& results) {
  out << "side A: " << info.side_a << "\nside B: " << info.side_b << "\nlink:   " << info.link << "\n";
  if (info.globaltimer_tick_ns > 0) out << "globaltimer step: " << fixed(info.globaltimer_tick_ns, 0) << " ns\n";
  out << "\n"
      << pad("measurement", 34, false) << pad("median us", 11, true) << pad("p10", 9, true) << pad("p90", 9, true)
      << pad("n", 8, true) << "\n";
  for (const auto& m : results) {
    if (!m.error.empty()) {
      out << pad(m.name, 34, false) << "  FAILED: " << m.error << "\n";
      continue;
    }
    const Summary s = summarize(m.samples_us);
    out << pad(m.name, 34, false) << pad(fixed(s.median, 3), 11, true) << pad(fixed(s.p10, 3), 9, true)
        << pad(fixed(s.p90, 3), 9, true) << pad(std::to_string(s.count), 8, true);
    if (m.unit != "us") out << "  " << m.unit;  // the columns hold this unit, not us
    out << "\n";
    for (const auto& [key, value] : m.extras) {
      const bool whole = std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e15;
      out << "    " << key << " = " << fixed(value, whole ? 0 : 3) << "\n";
    }
  }
  out << "\nWhat each line measures:\n";
  for (const auto& m : results) out << "  " << m.name << ": " << m.what << "\n";
}

void write_json(std::ostream& out, const RunInfo& info, const std::vector<Measurement>& results) {
  out << "{\n  \"tool\": \"moe_ep_latency_probe\",\n  \"format\": 1,\n  \"unit\": \"us\",\n";
  out << "  \"side_a\": " << json_string(info.side_a) << ",\n  \"side_b\": " << json_string(info.side_b)
      << ",\n  \"link\": " << json_string(info.link) << ",\n  \"same_gpu\": " << (info.same_gpu ? "true" : "false")
      << ",\n  \"globaltimer_tick_ns\": " << json_number(info.globaltimer_tick_ns) << ",\n  \"config\": {";
  for (size_t i = 0; i < info.config.size(); ++i) {
    out << (i ? ", " : "") << json_string(info.config[i].first) << ": " << info.config[i].second;
  }
  out << "},\n  \"measurements\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const Measurement& m = results[i];
    out << (i ? ",\n" : "\n") << "    {\"name\": " << json_string(m.name) << ", \"what\": " << json_string(m.what);
    if (m.unit != "us") out << ", \"unit\": " << json_string(m.unit);  // else the file's "unit"
    if (!m.error.empty()) {
      out << ", \"ok\": false, \"error\": " << json_string(m.error) << "}";
      continue;
    }
    const Summary s = summarize(m.samples_us);
    out << ", \"ok\": true, \"count\": " << s.count << ", \"median\": " << json_number(s.median)
        << ", \"p10\": " << json_number(s.p10) << ", \"p90\": " << json_number(s.p90)
        << ", \"mean\": " << json_number(s.mean) << ", \"min\": " << json_number(s.min)
        << ", \"max\": " << json_number(s.max) << ", \"extras\": {";
    for (size_t k = 0; k < m.extras.size(); ++k) {
      out << (k ? ", " : "") << json_string(m.extras[k].first) << ": " << json_number(m.extras[k].second);
    }
    out << "}}";
  }
  out << "\n  ]\n}\n";
}

}  // namespace moe_ep_probe
