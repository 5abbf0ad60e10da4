// The host side of moe_ep_latency_probe without a GPU: statistics, options
// and the JSON report.
#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "bandwidth_plan.hpp"
#include "evented_times.hpp"
#include "probe_options.hpp"
#include "probe_report.hpp"

using namespace moe_ep_probe;

namespace {

std::string option_error(const std::vector<std::string>& args) {
  try {
    parse_options(args);
  } catch (const OptionError& e) {
    return e.what();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("percentiles interpolate between the two nearest ranks", "[latency_probe]") {
  const std::vector<double> four = {1, 2, 3, 4};
  CHECK(percentile_sorted(four, 0.5) == Approx(2.5));
  CHECK(percentile_sorted(four, 0.0) == Approx(1.0));
  CHECK(percentile_sorted(four, 1.0) == Approx(4.0));
  CHECK(percentile_sorted(four, 0.1) == Approx(1.3));
  std::vector<double> eleven;
  for (int i = 0; i <= 10; ++i) eleven.push_back(i);
  CHECK(percentile_sorted(eleven, 0.1) == Approx(1.0));
  CHECK(percentile_sorted(eleven, 0.9) == Approx(9.0));
  CHECK(percentile_sorted({}, 0.5) == 0.0);
  CHECK(percentile_sorted({7}, 0.9) == 7.0);
}

TEST_CASE("summarize sorts and reports median, p10, p90, mean, min and max", "[latency_probe]") {
  const Summary s = summarize({9, 1, 5, 3, 7, 2, 8, 4, 6, 10, 0});
  CHECK(s.count == 11);
  CHECK(s.median == Approx(5));
  CHECK(s.p10 == Approx(1));
  CHECK(s.p90 == Approx(9));
  CHECK(s.mean == Approx(5));
  CHECK(s.min == 0);
  CHECK(s.max == 10);
  CHECK(summarize({}).count == 0);
}

TEST_CASE("options: defaults, both spellings of a value, groups in run order", "[latency_probe]") {
  const ProbeOptions d = parse_options({});
  CHECK(d.round_trips == 10000);
  CHECK(d.graph_replays == 1000);
  CHECK(d.timeout_ms == 1000);
  CHECK(d.groups == all_groups());
  CHECK(d.json_path.empty());
  CHECK_FALSE(d.same_gpu);

  const ProbeOptions o = parse_options(
      {"--round-trips", "500", "--timeout-ms=20", "--json", "x.json", "--same-gpu", "--only", "ll,flag,ll"});
  CHECK(o.round_trips == 500);
  CHECK(o.timeout_ms == 20);
  CHECK(o.json_path == "x.json");
  CHECK(o.same_gpu);
  CHECK(o.groups == std::vector<std::string>{"flag", "ll"});
  CHECK(parse_options({"-h"}).help);
}

TEST_CASE("options: group call and its iterations and batch", "[latency_probe]") {
  const ProbeOptions d = parse_options({});
  CHECK(d.call_iterations == 2000);
  CHECK(d.call_batch == 16);
  CHECK(d.groups.back() == "bw");

  const ProbeOptions o = parse_options({"--only", "call,launch", "--call-iterations=300", "--call-batch", "8"});
  CHECK(o.groups == std::vector<std::string>{"launch", "call"});
  CHECK(o.call_iterations == 300);
  CHECK(o.call_batch == 8);
  CHECK(parse_options({"--call-batch", "1000"}).call_batch == 1000);

  CHECK(option_error({"--call-batch", "0"}) == "--call-batch: expected an integer in [1, 1000], got '0'");
  CHECK(option_error({"--call-batch=1001"}) == "--call-batch: expected an integer in [1, 1000], got '1001'");
  CHECK(option_error({"--call-iterations", "100001"}) ==
        "--call-iterations: expected an integer in [1, 100000], got '100001'");
  CHECK(option_error({"--call-iterations"}) == "--call-iterations: expected a value after it, got the end of the line");
  CHECK(option_error({"--only", "calls"}) ==
        "--only: expected a comma-separated list of launch, flag, row, ll, load, call, bw; got 'calls' ('calls' is not "
        "a group)");
}

TEST_CASE("options: a bad argument names itself, what was expected and what was given", "[latency_probe]") {
  CHECK(option_error({"--round-trips", "0"}) == "--round-trips: expected an integer in [1, 1000000], got '0'");
  CHECK(option_error({"--round-trips=abc"}) == "--round-trips: expected an integer in [1, 1000000], got 'abc'");
  CHECK(option_error({"--graph-replays", "5x"}) == "--graph-replays: expected an integer in [1, 100000], got '5x'");
  CHECK(option_error({"--timeout-ms", "99999999999999999999"}).find("got '99999999999999999999'") != std::string::npos);
  CHECK(option_error({"--timeout-ms", ""}).find("got ''") != std::string::npos);
  CHECK(option_error({"--kernel-runs"}) == "--kernel-runs: expected a value after it, got the end of the line");
  CHECK(option_error({"--json="}) == "--json: expected a file name, got ''");
  CHECK(option_error({"--same-gpu=1"}) == "--same-gpu: expected no value, got '1'");
  CHECK(option_error({"--only", "flag,bogus"}).find("'bogus' is not a group") != std::string::npos);
  CHECK(option_error({"--only", ""}).find("--only: expected") == 0);
  CHECK(option_error({"--frobnicate"}) == "unknown argument '--frobnicate' (see --help)");
  CHECK(option_error({"extra"}) == "unknown argument 'extra' (see --help)");
}

TEST_CASE("usage names every option and the exit statuses", "[latency_probe]") {
  const std::string usage = usage_text();
  for (const char* word :
       {"--json FILE", "--only LIST", "--same-gpu", "--round-trips N", "--warmup-trips N", "--kernel-runs N",
        "--graph-replays N", "--graph-blocks N", "--chase-loads N", "--call-iterations N", "--call-batch N",
        "--timeout-ms N", "launch,flag,row,ll,load,call,bw", "3 no CUDA device"}) {
    CHECK(usage.find(word) != std::string::npos);
  }
}

TEST_CASE("JSON: strings escaped, measured and failed lines, non-finite numbers as null", "[latency_probe]") {
  CHECK(json_string("a\"b\\c\nd\x01") == "\"a\\\"b\\\\c\\nd\\u0001\"");

  RunInfo info;
  info.side_a = "GPU 0 (\"X\")";
  info.side_b = "GPU 1";
  info.link = "same GPU: not NVLink";
  info.same_gpu = true;
  info.config = {{"round_trips", 10}};
  const std::vector<Measurement> results = {
      {"flag_one_way_relaxed", "one way", {1, 2, 3, 4}, "", {{"mean_one_way_globaltimer_us", 2.5}}},
      {"ll_row_one_way", "flags in data", {}, "timeout: side B", {}},
      {"odd", "a NaN extra", {1}, "", {{"x", std::nan("")}, {"blocks_host_bound", 3}}},
  };
  std::ostringstream json;
  write_json(json, info, results);
  const std::string text = json.str();
  CHECK(text.find("\"side_a\": \"GPU 0 (\\\"X\\\")\"") != std::string::npos);
  CHECK(text.find("\"same_gpu\": true") != std::string::npos);
  CHECK(text.find("\"config\": {\"round_trips\": 10}") != std::string::npos);
  CHECK(text.find("{\"name\": \"flag_one_way_relaxed\", \"what\": \"one way\", \"ok\": true, \"count\": 4, "
                  "\"median\": 2.5, \"p10\": 1.3, \"p90\": 3.7") != std::string::npos);
  CHECK(text.find("\"extras\": {\"mean_one_way_globaltimer_us\": 2.5}") != std::string::npos);
  CHECK(text.find("\"ok\": false, \"error\": \"timeout: side B\"}") != std::string::npos);
  CHECK(text.find("\"x\": null, \"blocks_host_bound\": 3}") != std::string::npos);
  // Balanced braces and brackets (no string here contains one).
  int depth = 0;
  for (char c : text) {
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    CHECK(depth >= 0);
  }
  CHECK(depth == 0);

  std::ostringstream table;
  print_table(table, info, results);
  CHECK(table.str().find("same GPU: not NVLink") != std::string::npos);
  CHECK(table.str().find("    mean_one_way_globaltimer_us = 2.500\n") != std::string::npos);
  CHECK(table.str().find("    blocks_host_bound = 3\n") != std::string::npos);
  CHECK(table.str().find("ll_row_one_way                      FAILED: timeout: side B") != std::string::npos);
}

TEST_CASE("benchmark-style timings: the slower side per iteration and phase, medians per side and phase",
          "[latency_probe]") {
  EventedTimes t;
  // Two sides, two phases, three iterations.
  t.us = {{{1, 5, 3}, {10, 10, 10}}, {{2, 4, 3}, {11, 9, 30}}};
  t.batches_gate_expired = 2;
  const Measurement m = evented_measurement("exchange", "two sides", t);
  REQUIRE(m.error.empty());
  CHECK(m.name == "exchange");
  CHECK(m.samples_us == std::vector<double>{2, 5, 3, 11, 10, 30});
  REQUIRE(m.extras.size() == 5);
  CHECK(m.extras[0] == std::make_pair(std::string("side_a_median_us"), 7.5));  // {1, 3, 5, 10, 10, 10}
  CHECK(m.extras[1] == std::make_pair(std::string("side_b_median_us"), 6.5));  // {2, 3, 4, 9, 11, 30}
  CHECK(m.extras[2] == std::make_pair(std::string("phase_1_median_us"), 3.0));
  CHECK(m.extras[3] == std::make_pair(std::string("phase_2_median_us"), 11.0));
  CHECK(m.extras[4] == std::make_pair(std::string("batches_gate_expired"), 2.0));

  // One side, one phase: its own samples, no per-side or per-phase extras.
  EventedTimes one;
  one.us = {{{4, 2}}};
  const Measurement single = evented_measurement("graph", "one side", one);
  CHECK(single.samples_us == std::vector<double>{4, 2});
  REQUIRE(single.extras.size() == 1);
  CHECK(single.extras[0].first == "batches_gate_expired");
}

TEST_CASE("benchmark-style timings: an error or a ragged shape fails the line without samples", "[latency_probe]") {
  EventedTimes failed;
  failed.us = {{{1}}, {{1}}};
  failed.error = "timeout: side B waited more than 5 ms for the peer's add of round 7";
  const Measurement m = evented_measurement("exchange", "x", failed);
  CHECK(m.error == failed.error);
  CHECK(m.samples_us.empty());

  EventedTimes ragged;
  ragged.us = {{{1, 2}}, {{1}}};
  CHECK(evented_measurement("x", "x", ragged).error.find("different numbers of iterations") != std::string::npos);
  ragged.us = {{{1}, {2}}, {{1}}};
  CHECK(evented_measurement("x", "x", ragged).error.find("different numbers of phases") != std::string::npos);
  CHECK(evented_measurement("x", "x", EventedTimes{}).error == "no sides or no phases were timed");
}

TEST_CASE("options: group bw alone, and with others in run order", "[latency_probe]") {
  CHECK(parse_options({"--only", "bw"}).groups == std::vector<std::string>{"bw"});
  CHECK(parse_options({"--only=bw,launch"}).groups == std::vector<std::string>{"launch", "bw"});
  CHECK(option_error({"--only", "bandwidth"}).find("'bandwidth' is not a group") != std::string::npos);
}

TEST_CASE("bandwidth: grid sizes 1, 4, 8, 16, 24 up to the SM count, then the SM count", "[latency_probe]") {
  CHECK(bandwidth_grids(132) == std::vector<int>{1, 4, 8, 16, 24, 132});
  CHECK(bandwidth_grids(24) == std::vector<int>{1, 4, 8, 16, 24});
  CHECK(bandwidth_grids(20) == std::vector<int>{1, 4, 8, 16, 20});
  CHECK(bandwidth_grids(4) == std::vector<int>{1, 4});
  CHECK(bandwidth_grids(1) == std::vector<int>{1});
  CHECK(bandwidth_grids(0).empty());
  CHECK(bandwidth_grids(-3).empty());
}

TEST_CASE("bandwidth: a block's slice is its share of the kernel's bytes, whole granules", "[latency_probe]") {
  const size_t MiB = 1ull << 20, KiB = 1ull << 10;
  // The probe's own sizes: 32 MiB per block up to 8 blocks, then 256 MiB shared.
  CHECK(bandwidth_slice_bytes(1, 32 * MiB, 256 * MiB, 64 * KiB) == 32 * MiB);
  CHECK(bandwidth_slice_bytes(8, 32 * MiB, 256 * MiB, 64 * KiB) == 32 * MiB);
  CHECK(bandwidth_slice_bytes(16, 32 * MiB, 256 * MiB, 64 * KiB) == 16 * MiB);
  CHECK(bandwidth_slice_bytes(24, 32 * MiB, 256 * MiB, 64 * KiB) == 10880 * KiB);  // 10922.67 KiB rounded down
  CHECK(bandwidth_slice_bytes(132, 32 * MiB, 256 * MiB, 64 * KiB) == 1984 * KiB);  // 1985.94 KiB rounded down
  CHECK(bandwidth_slice_bytes(132, 32 * MiB, 256 * MiB, 64 * KiB) * 132 <= 256 * MiB);
  CHECK(bandwidth_slice_bytes(8192, 32 * MiB, 256 * MiB, 64 * KiB) == 0);  // below one granule
  CHECK(bandwidth_slice_bytes(0, 32 * MiB, 256 * MiB, 64 * KiB) == 0);
  CHECK(bandwidth_slice_bytes(4, 32 * MiB, 256 * MiB, 0) == 0);
  // No overflow of blocks x per_block.
  CHECK(bandwidth_slice_bytes(1 << 30, ~size_t(0), ~size_t(0), 1) == ~size_t(0) / (size_t(1) << 30));
}

TEST_CASE("bandwidth: GB/s are 10^9 bytes per second", "[latency_probe]") {
  CHECK(gigabytes_per_second(1e9, 1000) == Approx(1.0));
  CHECK(gigabytes_per_second(256.0 * (1 << 20), 1.0) == Approx(268.435456));
  CHECK(gigabytes_per_second(32.0 * (1 << 20), 3.3554432) == Approx(10.0));
  CHECK(gigabytes_per_second(1e9, 0) == 0);
  CHECK(gigabytes_per_second(1e9, -1) == 0);
  CHECK(gigabytes_per_second(1e9, std::nan("")) == 0);
}

TEST_CASE("report: a line in GB/s is marked in the table and carries its unit in the JSON", "[latency_probe]") {
  RunInfo info;
  Measurement bw{"bw_remote_read_G16", "remote loads", {160, 150, 170}, "", {{"per_sm_GBps", 10}}};
  bw.unit = "GB/s";
  const std::vector<Measurement> results = {bw, {"flag_one_way_relaxed", "one way", {1}, "", {}}};
  std::ostringstream table, json;
  print_table(table, info, results);
  write_json(json, info, results);
  CHECK(table.str().find("bw_remote_read_G16                    160.000  152.000  168.000       3  GB/s\n") !=
        std::string::npos);
  CHECK(table.str().find("    per_sm_GBps = 10\n") != std::string::npos);
  CHECK(table.str().find("flag_one_way_relaxed                    1.000    1.000    1.000       1\n") !=
        std::string::npos);
  CHECK(json.str().find("{\"name\": \"bw_remote_read_G16\", \"what\": \"remote loads\", \"unit\": \"GB/s\", "
                        "\"ok\": true, \"count\": 3, \"median\": 160") != std::string::npos);
  CHECK(json.str().find("{\"name\": \"flag_one_way_relaxed\", \"what\": \"one way\", \"ok\": true") !=
        std::string::npos);
}
