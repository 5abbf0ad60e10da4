// The tuning registry (src/common/tuning_registry.hpp): its one parser for
// every type, range edges and malformed values; create refusing a bad knob
// with INVALID_ARGUMENT naming it; docs/api.md's table against the
// declarations; and the path a HOST handle reports.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/call_path.hpp"
#include "common/tuning_registry.hpp"
#include "dtypes.hpp"
#include "error.hpp"
#include "moe_ep_c.h"
#include "scoped_environment.hpp"
#include "tensor_view.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

using Catch::Matchers::Contains;
using moe_ep::Knob;
using moe_ep::KnobSpec;
using moe_ep::KnobType;
using moe_ep_test::ScopedEnvironment;

namespace {

KnobSpec spec_of(KnobType type, int64_t deflt, int64_t lo, int64_t hi, const char* choices = nullptr) {
  return KnobSpec{"MOE_EP_TEST_KNOB", type, deflt, lo, hi, choices, "a knob of the tests"};
}

// The parsed value, or INT64_MIN where the parser refuses the text.
constexpr int64_t kRefused = INT64_MIN;
int64_t parsed(const KnobSpec& spec, const char* text) {
  const moe_ep::KnobParse p = moe_ep::parse_knob(spec, text);
  if (!p.ok) {
    CHECK_FALSE(p.error.empty());
    return kRefused;
  }
  return p.value;
}

// Cells of a markdown table row "| a | b | c |", trimmed, without backticks.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '|') {
      const size_t b = cell.find_first_not_of(' '), e = cell.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? std::string() : cell.substr(b, e - b + 1));
      cell.clear();
    } else if (line[i] != '`') {
      cell += line[i];
    }
  }
  return cells;
}

// docs/api.md of the tree this test was built from: __FILE__ is absolute, or
// relative to the build directory, two levels above this executable
// (<build>/test/test_unit).
std::string api_md_path() {
  std::string here = __FILE__;  // <tree>/test/src/test_tuning_registry.cpp
  if (here.empty() || here[0] != '/') {
    char exe[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    std::string build = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string(".");
    for (int up = 0; up < 2; ++up) build = build.substr(0, build.rfind('/'));
    here = build + "/" + here;
  }
  return here.substr(0, here.rfind("/test/src/")) + "/docs/api.md";
}

// docs/api.md's table of environment variables: name -> its cells.
std::map<std::string, std::vector<std::string>> documented_knobs(std::vector<std::string>* header) {
  const std::string path = api_md_path();
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  std::map<std::string, std::vector<std::string>> rows;
  bool in_section = false, in_table = false;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) {
      in_section = line == "## Environment variables";
      in_table = false;
      continue;
    }
    if (!in_section) continue;
    if (line.rfind("|", 0) != 0) {
      if (in_table) break;  // the table ended
      continue;
    }
    std::vector<std::string> cells = cells_of(line);
    if (!in_table) {
      *header = cells;
      in_table = true;
      continue;
    }
    if (!cells.empty() && cells[0].rfind("---", 0) == 0) continue;
    REQUIRE_FALSE(cells.empty());
    INFO("docs/api.md row: " << line);
    CHECK(rows.count(cells[0]) == 0);  // each knob once
    rows[cells[0]] = cells;
  }
  return rows;
}

moe_ep_status_t create_host(moe_ep_handle_t* h) {
  const moe_ep_bootstrap_t b = moe_ep_test::single_rank_bootstrap();
  const moe_ep_params_t p = moe_ep_test::make_params(4, 2, 4, 8);
  const moe_ep_config_t c = moe_ep_test::host_config();
  return moe_ep_create(&b, &p, &c, h);
}

}  // namespace

TEST_CASE("registry parser: booleans in any case, nothing else", "[registry]") {
  const KnobSpec b = spec_of(KnobType::kBool, 1, 0, 1);
  CHECK(parsed(b, nullptr) == 1);  // unset: the default
  for (const char* on : {"1", "true", "TRUE", "True", "on", "ON", "yes", "Yes"}) {
    INFO(on);
    CHECK(parsed(b, on) == 1);
  }
  for (const char* off : {"0", "false", "FALSE", "off", "Off", "no", "NO"}) {
    INFO(off);
    CHECK(parsed(b, off) == 0);
  }
  for (const char* bad : {"", "2", "-1", "01", "10", "yes please", " 1", "1 ", "tru", "registers"}) {
    INFO("\"" << bad << "\"");
    CHECK(parsed(b, bad) == kRefused);
  }
  const moe_ep::KnobParse p = moe_ep::parse_knob(b, "maybe");
  CHECK_THAT(p.error, Contains("expected 0 or 1") && Contains("got \"maybe\""));
}

TEST_CASE("registry parser: switches are auto or a forced boolean", "[registry]") {
  const KnobSpec s = spec_of(KnobType::kSwitch, -1, 0, 0);
  CHECK(parsed(s, nullptr) == -1);
  CHECK(parsed(s, "auto") == -1);
  CHECK(parsed(s, "AUTO") == -1);
  CHECK(parsed(s, "1") == 1);
  CHECK(parsed(s, "on") == 1);
  CHECK(parsed(s, "0") == 0);
  CHECK(parsed(s, "False") == 0);
  for (const char* bad : {"", "automatic", "-1", "2", "junk"}) {
    INFO("\"" << bad << "\"");
    CHECK(parsed(s, bad) == kRefused);
  }
}

TEST_CASE("registry parser: integers within the range, range edges, malformed and overflowing text", "[registry]") {
  const KnobSpec n = spec_of(KnobType::kInt, 2, 1, 16);
  CHECK(parsed(n, nullptr) == 2);
  CHECK(parsed(n, "1") == 1);    // lower edge
  CHECK(parsed(n, "16") == 16);  // upper edge
  CHECK(parsed(n, "+7") == 7);
  CHECK(parsed(n, "0") == kRefused);
  CHECK(parsed(n, "17") == kRefused);
  CHECK(parsed(n, "-1") == kRefused);
  for (const char* bad : {"", "12abc", "abc", "1.5", "0x10", " 3", "3 ", "+", "-", "1e3",
                          "99999999999999999999", "-99999999999999999999", "9223372036854775808"}) {
    INFO("\"" << bad << "\"");
    CHECK(parsed(n, bad) == kRefused);
  }
  const moe_ep::KnobParse p = moe_ep::parse_knob(n, "12abc");
  CHECK(p.error == "expected an integer in [1, 16], got \"12abc\"");
  const KnobSpec wide = spec_of(KnobType::kInt, 0, INT64_MIN + 1, INT64_MAX);
  CHECK(parsed(wide, "9223372036854775807") == INT64_MAX);
  CHECK(parsed(wide, "-9223372036854775807") == INT64_MIN + 1);
  CHECK(parsed(wide, "9223372036854775808") == kRefused);
}

TEST_CASE("registry parser: choices by word in any case, value = index", "[registry]") {
  const KnobSpec c = spec_of(KnobType::kChoice, 2, 0, 0, "serial|overlapped|auto");
  CHECK(parsed(c, nullptr) == 2);
  CHECK(parsed(c, "serial") == 0);
  CHECK(parsed(c, "Overlapped") == 1);
  CHECK(parsed(c, "AUTO") == 2);
  for (const char* bad : {"", "seria", "serials", "overlapped|auto", "1", "serial "}) {
    INFO("\"" << bad << "\"");
    CHECK(parsed(c, bad) == kRefused);
  }
  CHECK_THAT(moe_ep::parse_knob(c, "fast").error, Contains("one of serial, overlapped, auto"));
  CHECK(moe_ep::knob_default_text(c) == "auto");
  CHECK(moe_ep::knob_range_text(c) == "serial, overlapped, auto");
}

TEST_CASE("registry: declarations are unique, defaults within their ranges, one line of documentation", "[registry]") {
  std::set<std::string> names;
  for (size_t i = 0; i < moe_ep::kKnobCount; ++i) {
    const KnobSpec& s = moe_ep::knob_spec(static_cast<Knob>(i));
    INFO(s.name);
    CHECK(names.insert(s.name).second);
    CHECK(std::string(s.name).rfind("MOE_EP_", 0) == 0);
    CHECK(std::string(s.name).rfind("MOE_EP_TEST_", 0) != 0);
    CHECK(moe_ep::find_knob(s.name) == &s);
    REQUIRE(s.doc != nullptr);
    CHECK(std::string(s.doc).find('\n') == std::string::npos);
    CHECK(std::string(s.doc).size() > 20);
    // The default, written as text, parses back to the default.
    if (s.type != KnobType::kPath) {
      const std::string d = moe_ep::knob_default_text(s);
      const moe_ep::KnobParse p = moe_ep::parse_knob(s, d.c_str());
      CHECK(p.ok);
      CHECK(p.value == s.default_value);
    }
    if (s.type == KnobType::kInt) CHECK(s.min <= s.default_value);
    if (s.type == KnobType::kInt) CHECK(s.default_value <= s.max);
  }
  CHECK(moe_ep::find_knob("MOE_EP_NO_SUCH_KNOB") == nullptr);
}

TEST_CASE("registry: knob_value reads the environment and names the variable when it refuses", "[registry]") {
  {
    const ScopedEnvironment v("MOE_EP_PULL_PRODUCERS", nullptr);
    CHECK(moe_ep::knob_int(Knob::kPullProducers) == moe_ep::knob_spec(Knob::kPullProducers).default_value);
  }
  {
    const ScopedEnvironment v("MOE_EP_PULL_PRODUCERS", "4");
    CHECK(moe_ep::knob_int(Knob::kPullProducers) == 4);
  }
  {
    const ScopedEnvironment v("MOE_EP_PULL_PRODUCERS", "9");
    try {
      moe_ep::knob_value(Knob::kPullProducers);
      FAIL("no error for MOE_EP_PULL_PRODUCERS=9");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(std::string(e.what()), Contains("MOE_EP_PULL_PRODUCERS") && Contains("[1, 4]") &&
                                            Contains("got \"9\""));
    }
    CHECK(moe_ep::knob_value_or_default(Knob::kPullProducers) == 2);
  }
  {
    const ScopedEnvironment v("MOE_EP_DISPATCH_LOOKBACK", "auto");
    CHECK_FALSE(moe_ep::knob_switch(Knob::kDispatchLookback).has_value());
  }
  {
    const ScopedEnvironment v("MOE_EP_DISPATCH_LOOKBACK", "1");
    CHECK(moe_ep::knob_switch(Knob::kDispatchLookback) == std::optional<bool>(true));
  }
  {
    const ScopedEnvironment v("MOE_EP_NCCL_LIBRARY", nullptr);
    CHECK(moe_ep::knob_text(Knob::kNcclLibrary) == "libnccl.so.2");
  }
  {
    const ScopedEnvironment v("MOE_EP_NCCL_LIBRARY", "");
    CHECK(moe_ep::knob_text(Knob::kNcclLibrary) == "libnccl.so.2");
  }
  {
    const ScopedEnvironment v("MOE_EP_NCCL_LIBRARY", "/opt/nccl/lib/libnccl.so.2");
    CHECK(moe_ep::knob_text(Knob::kNcclLibrary) == "/opt/nccl/lib/libnccl.so.2");
  }
}

TEST_CASE("create: a malformed or out-of-range knob is INVALID_ARGUMENT naming it, the range and the value",
          "[registry][validation]") {
  const struct {
    const char* name;
    const char* value;
    const char* expected;
  } cases[] = {
      {"MOE_EP_SMALL_DISPATCH_TOKENS", "513", "[1, 512]"},
      {"MOE_EP_SMALL_DISPATCH_TOKENS", "0", "[1, 512]"},
      {"MOE_EP_SMALL_COMBINE_TOKENS", "12abc", "[1, 512]"},
      {"MOE_EP_PULL_PRODUCERS", "-1", "[1, 4]"},
      {"MOE_EP_NCCL_DISPATCH_CHUNKS", "99999999999999999999", "[1, 16]"},
      {"MOE_EP_NCCL_COMBINE_CHUNKS", "", "[1, 16]"},
      {"MOE_EP_PDL", "2", "0 or 1"},
      {"MOE_EP_SMALL_BATCH", "junk", "0 or 1"},
      {"MOE_EP_DISPATCH_BULK", "junk", "auto, 0 or 1"},
      {"MOE_EP_COMBINE_SCHEDULE", "fast", "one of serial, overlapped, auto"},
      {"MOE_EP_LOG", "verbose", "one of off, info, debug"},
  };
  for (const auto& c : cases) {
    INFO(c.name << "=\"" << c.value << "\"");
    const ScopedEnvironment v(c.name, c.value);
    moe_ep_handle_t h = nullptr;
    CHECK(create_host(&h) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(h == nullptr);
    const std::string message = moe_ep_last_error();
    CHECK_THAT(message, Contains(c.name) && Contains(c.expected) && Contains(std::string("got \"") + c.value + "\""));
  }
  // Valid values and unknown MOE_EP_* variables (ignored) create as before.
  const ScopedEnvironment tokens("MOE_EP_SMALL_DISPATCH_TOKENS", "512");
  const ScopedEnvironment schedule("MOE_EP_COMBINE_SCHEDULE", "Serial");
  const ScopedEnvironment unknown("MOE_EP_NOT_A_KNOB", "1");
  moe_ep_handle_t h = nullptr;
  REQUIRE(create_host(&h) == MOE_EP_SUCCESS);
  moe_ep_destroy(&h);
}

TEST_CASE("docs/api.md's table of environment variables is the registry's declarations", "[registry][docs]") {
  std::vector<std::string> header;
  const std::map<std::string, std::vector<std::string>> rows = documented_knobs(&header);
  REQUIRE(header.size() >= 4);
  CHECK(header[0] == "variable");
  CHECK(header[1] == "default");
  CHECK(header[2] == "range");
  std::set<std::string> declared;
  for (size_t i = 0; i < moe_ep::kKnobCount; ++i) {
    const KnobSpec& s = moe_ep::knob_spec(static_cast<Knob>(i));
    declared.insert(s.name);
    INFO(s.name);
    const auto row = rows.find(s.name);
    CHECK(row != rows.end());  // a row for every knob
    if (row == rows.end()) continue;
    REQUIRE(row->second.size() >= 4);
    CHECK(row->second[1] == moe_ep::knob_default_text(s));
    CHECK(row->second[2] == moe_ep::knob_range_text(s));
    CHECK(row->second[3] == s.doc);  // the declaration's one line, as it is
  }
  for (const auto& row : rows) {
    INFO(row.first);
    CHECK(declared.count(row.first) == 1);  // no row for a knob that is not declared
  }
}

TEST_CASE("HOST backend reports its path for each phase", "[registry][path]") {
  using namespace moe_ep_verify;
  moe_ep_handle_t h = nullptr;
  REQUIRE(create_host(&h) == MOE_EP_SUCCESS);
  int32_t path = -1;
  REQUIRE(moe_ep_get_last_path(h, MOE_EP_PHASE_DISPATCH, &path) == MOE_EP_SUCCESS);
  CHECK(path == MOE_EP_PATH_NONE);
  REQUIRE(moe_ep_get_last_path(h, MOE_EP_PHASE_COMBINE, &path) == MOE_EP_SUCCESS);
  CHECK(path == MOE_EP_PATH_NONE);

  std::vector<uint16_t> hidden(3 * 8, 0x3F80);
  std::vector<int32_t> ids = {0, 1, 2, 3, 1, -1};
  TensorView hidden_t(hidden.data(), bf16_dtype(), {3, 8});
  TensorView ids_t(ids.data(), int32_dtype(), {3, 2});
  moe_ep_dispatch_args_t args;
  moe_ep_dispatch_args_init(&args, sizeof args);
  args.hidden_states = hidden_t.get();
  args.topk_ids = ids_t.get();
  moe_ep_dispatch_result_t result;
  moe_ep_dispatch_result_init(&result, sizeof result);
  REQUIRE(moe_ep_dispatch(h, &args, &result, nullptr) == MOE_EP_SUCCESS);
  REQUIRE(moe_ep_get_last_path(h, MOE_EP_PHASE_DISPATCH, &path) == MOE_EP_SUCCESS);
  CHECK(path == MOE_EP_PATH_HOST);
  REQUIRE(moe_ep_get_last_path(h, MOE_EP_PHASE_COMBINE, &path) == MOE_EP_SUCCESS);
  CHECK(path == MOE_EP_PATH_NONE);

  std::vector<uint16_t> expert_output(4 * 8, 0x3F80);
  TensorView expert_output_t(expert_output.data(), bf16_dtype(), {4, 8});
  moe_ep_combine_result_t combined;
  moe_ep_combine_result_init(&combined, sizeof combined);
  REQUIRE(moe_ep_combine(h, expert_output_t.get(), nullptr, &combined, nullptr) == MOE_EP_SUCCESS);
  REQUIRE(moe_ep_get_last_path(h, MOE_EP_PHASE_COMBINE, &path) == MOE_EP_SUCCESS);
  CHECK(path == MOE_EP_PATH_HOST);
  CHECK(std::string(moe_ep_path_name(path)) == "host");

  CHECK(moe_ep_get_last_path(h, 2, &path) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(std::string(moe_ep_last_error()), Contains("phase") && Contains("got 2"));
  CHECK(moe_ep_get_last_path(h, MOE_EP_PHASE_DISPATCH, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_get_last_path(nullptr, MOE_EP_PHASE_DISPATCH, &path) == MOE_EP_ERROR_INVALID_ARGUMENT);
  moe_ep_destroy(&h);
}

TEST_CASE("path names: every path has its own, other values are unknown", "[registry][path]") {
  const int32_t paths[] = {MOE_EP_PATH_NONE,
                           MOE_EP_PATH_HOST,
                           MOE_EP_PATH_NCCL,
                           MOE_EP_PATH_DISPATCH_SMALL,
                           MOE_EP_PATH_DISPATCH_SMALL_BULK,
                           MOE_EP_PATH_DISPATCH_SCAN,
                           MOE_EP_PATH_DISPATCH_SCAN_BULK,
                           MOE_EP_PATH_DISPATCH_LOOKBACK,
                           MOE_EP_PATH_DISPATCH_LOOKBACK_BULK,
                           MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE,
                           MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE,
                           MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE,
                           MOE_EP_PATH_COMBINE_SMALL_PUSH,
                           MOE_EP_PATH_COMBINE_SERIAL_PUSH,
                           MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH,
                           MOE_EP_PATH_COMBINE_PULL_ROWS,
                           MOE_EP_PATH_COMBINE_PULL_SEGMENTS,
                           MOE_EP_PATH_COMBINE_PULL_REGISTERS,
                           MOE_EP_PATH_COMBINE_PULL_UNALIGNED};
  std::set<std::string> names;
  for (const int32_t p : paths) {
    INFO(p);
    CHECK(p < 64);  // CallPaths logs each path once by a bit of a 64-bit word
    const std::string name = moe_ep_path_name(p);
    CHECK(name != "unknown");
    CHECK(names.insert(name).second);
  }
  CHECK(std::string(moe_ep_path_name(3)) == "unknown");
  CHECK(std::string(moe_ep_path_name(-1)) == "unknown");
}
