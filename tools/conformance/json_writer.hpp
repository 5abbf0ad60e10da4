// A small streaming JSON writer (objects, arrays, numbers, strings, bools):
// enough for the benchmark's report, with no dependency.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moe_ep_tool {

class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& k);
  JsonWriter& value(const std::string& v);
  JsonWriter& value(const char* v) { return value(std::string(v)); }
  JsonWriter& value(double v);
  JsonWriter& value(int64_t v);
  JsonWriter& value(int v) { return value(int64_t(v)); }
  JsonWriter& value(bool v);
  JsonWriter& values(const std::vector<double>& v);
  JsonWriter& values(const std::vector<int64_t>& v);
  JsonWriter& values(const std::vector<std::string>& v);
  template <typename T>
  JsonWriter& field(const std::string& k, const T& v) {
    return key(k).value(v);
  }

  const std::string& text() const { return out_; }
  void save(const std::string& path) const;  // throws on failure

 private:
  void separate();
  JsonWriter& close(char bracket);
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

}  // namespace moe_ep_tool
