#include "json_writer.hpp"

#include <cmath>
#include <cstdio>

#include "errors.hpp"

namespace moe_ep_tool {

void JsonWriter::separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
    out_ += "\n" + std::string(2 * first_.size(), ' ');
  }
}

JsonWriter& JsonWriter::begin_object() {
  separate();
  out_ += "{";
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::close(char bracket) {
  const bool empty = first_.back();
  first_.pop_back();
  if (!empty) out_ += "\n" + std::string(2 * first_.size(), ' ');
  out_ += bracket;
  return *this;
}

JsonWriter& JsonWriter::end_object() { return close('}'); }

JsonWriter& JsonWriter::begin_array() {
  separate();
  out_ += "[";
  first_.push_back(true);
  return *this;
}

JsonWriter& JsonWriter::end_array() { return close(']'); }

JsonWriter& JsonWriter::key(const std::string& k) {
  value(k);
  out_ += ": ";
  after_key_ = true;
  return *this;
}

JsonWriter& JsonWriter::value(const std::string& v) {
  separate();
  out_ += "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      out_ += '\\';
      out_ += char(c);
    } else if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", c);
      out_ += esc;
    } else {
      out_ += char(c);
    }
  }
  out_ += "\"";
  return *this;
}

JsonWriter& JsonWriter::value(double v) {
  separate();
  if (!std::isfinite(v)) {
    out_ += "null";  // JSON has no NaN or infinity
    return *this;
  }
  char text[32];
  std::snprintf(text, sizeof text, "%.12g", v);  // byte counts stay exact
  out_ += text;
  return *this;
}

JsonWriter& JsonWriter::value(int64_t v) {
  separate();
  out_ += std::to_string(v);
  return *this;
}

JsonWriter& JsonWriter::value(bool v) {
  separate();
  out_ += v ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::values(const std::vector<double>& v) {
  begin_array();
  for (double x : v) value(x);
  return end_array();
}

JsonWriter& JsonWriter::values(const std::vector<int64_t>& v) {
  begin_array();
  for (int64_t x : v) value(x);
  return end_array();
}

JsonWriter& JsonWriter::values(const std::vector<std::string>& v) {
  begin_array();
  for (const std::string& x : v) value(x);
  return end_array();
}

void JsonWriter::save(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) fail("cannot write " + path);
  const bool ok = std::fwrite(out_.data(), 1, out_.size(), f) == out_.size() && std::fputc('\n', f) != EOF;
  if (std::fclose(f) != 0 || !ok) fail("cannot write " + path);
}

}  // namespace moe_ep_tool
