// Placing regions in a workspace or a record (src/common/region_planner.hpp):
// the NVLink and NCCL buffer plans, the HOST backend's dispatch record and the
// NVLink allocation size all take their offsets and sizes from it, so these
// cases pin where a region lands, what an empty region does, how buffer slots
// are counted and what an overflow reports.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>

#include "common/region_planner.hpp"
#include "error.hpp"

using Catch::Matchers::Contains;
using moe_ep::align_up;
using moe_ep::RegionPlanner;
using moe_ep::slot_start;
using moe_ep::slots_bytes;

namespace {

constexpr uint64_t kMax = UINT64_MAX;

// The status and message of the moe_ep::Error that `f` throws.
template <class F>
std::pair<moe_ep_status_t, std::string> thrown(F f) {
  try {
    f();
  } catch (const moe_ep::Error& e) {
    return {e.status(), e.what()};
  }
  return {MOE_EP_SUCCESS, "nothing thrown"};
}

}  // namespace

TEST_CASE("align_up: the next multiple, for powers of two and any other alignment", "[region_planner]") {
  struct Case {
    uint64_t value, alignment, expected;
  };
  const Case cases[] = {
      {0, 16, 0},
      {1, 16, 16},
      {16, 16, 16},
      {17, 16, 32},
      {255, 256, 256},
      {257, 256, 512},
      {7, 3, 9},  // an allocation granularity need not be a power of two
      {9, 3, 9},
      {5, 1, 5},
      {(uint64_t{3} << 20) + 1, uint64_t{2} << 20, uint64_t{4} << 20},
      {kMax - 15, 16, kMax - 15},  // the largest multiple of 16 still fits
  };
  for (const Case& c : cases) {
    INFO(c.value << " to a multiple of " << c.alignment);
    CHECK(align_up(c.value, c.alignment, "x") == c.expected);
  }
}

TEST_CASE("align_up: an overflow throws the status given, naming what overflowed", "[region_planner]") {
  const auto invalid = thrown([] { align_up(kMax - 14, 16, "the record"); });
  CHECK(invalid.first == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(invalid.second, Contains("the record") && Contains("overflows 64 bits") &&
                                 Contains(std::to_string(kMax - 14)) && Contains("multiple of 16"));
  const auto oom = thrown([] { align_up(kMax, 4096, "workspace", MOE_EP_ERROR_OUT_OF_MEMORY); });
  CHECK(oom.first == MOE_EP_ERROR_OUT_OF_MEMORY);
  CHECK_THAT(oom.second, Contains("workspace"));
  const auto zero = thrown([] { align_up(1, 0, "the record"); });
  CHECK(zero.first == MOE_EP_ERROR_INTERNAL);
  CHECK_THAT(zero.second, Contains("the record") && Contains("alignment > 0"));
}

TEST_CASE("RegionPlanner: each region at the end of the one before, rounded up; the end is rounded too",
          "[region_planner]") {
  RegionPlanner p("the workspace", 256);
  CHECK(p.end() == 0);
  CHECK(p.place(8) == 0);
  CHECK(p.place(0) == 256);  // an empty region takes no room: it starts where the next one does
  CHECK(p.place(1) == 256);
  CHECK(p.place(256) == 512);
  CHECK(p.place(257) == 768);
  CHECK(p.end() == 1280);
  CHECK(p.place(0) == 1280);
  CHECK(p.end() == 1280);
}

TEST_CASE("RegionPlanner: a start offset is rounded up before the first region", "[region_planner]") {
  RegionPlanner record("the record", 16, 16);  // after a 16-byte stamp: the first region right after it
  CHECK(record.end() == 16);
  CHECK(record.place(3) == 16);
  CHECK(record.place(0) == 32);
  CHECK(record.place(20) == 32);
  CHECK(record.end() == 64);

  RegionPlanner odd("the record", 16, 17);
  CHECK(odd.place(1) == 32);
  CHECK(odd.end() == 48);
}

TEST_CASE("RegionPlanner: an overflow throws the planner's status, naming what overflowed", "[region_planner]") {
  RegionPlanner p("the buffers", 256);
  CHECK(p.place(kMax - 255) == 0);  // the last 256-byte multiple below 2^64 is the end
  CHECK(p.end() == kMax - 255);
  CHECK(p.place(0) == kMax - 255);
  const auto past = thrown([&] { p.place(1); });  // its end rounds past 2^64
  CHECK(past.first == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(past.second, Contains("the buffers") && Contains("overflows 64 bits"));

  RegionPlanner q("the buffers", 256, 512, MOE_EP_ERROR_INVALID_INPUT);
  const auto sum = thrown([&] { q.place(kMax); });  // offset + bytes itself overflows
  CHECK(sum.first == MOE_EP_ERROR_INVALID_INPUT);
  CHECK_THAT(sum.second, Contains("the buffers") && Contains("offset 512") && Contains(std::to_string(kMax)));

  const auto start = thrown([] { RegionPlanner("the record", 16, kMax); });
  CHECK(start.first == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(start.second, Contains("the record"));
}

TEST_CASE("buffer slots: slot k starts at k x the slot's bytes; n slots take n x them", "[region_planner]") {
  CHECK(slot_start(1280, 0, "w") == 0);
  CHECK(slot_start(1280, 1, "w") == 1280);
  CHECK(slot_start(1280, 3, "w") == 3840);
  CHECK(slots_bytes(1280, 1, "w") == 1280);
  CHECK(slots_bytes(1280, 2, "w") == 2560);
  CHECK(slots_bytes(0, 2, "w") == 0);

  const auto none = thrown([] { slots_bytes(1280, 0, "the workspace"); });
  CHECK(none.first == MOE_EP_ERROR_INTERNAL);
  CHECK_THAT(none.second, Contains("the workspace") && Contains("at least 1 buffer slot, got 0"));
  const auto negative = thrown([] { slot_start(1280, -1, "the workspace"); });
  CHECK(negative.first == MOE_EP_ERROR_INTERNAL);
  CHECK_THAT(negative.second, Contains("got -1"));

  const auto total = thrown([] { slots_bytes(uint64_t{1} << 63, 2, "the workspace"); });
  CHECK(total.first == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(total.second, Contains("the workspace") && Contains("overflow 64 bits"));
  const auto start = thrown([] { slot_start(uint64_t{1} << 63, 2, "the workspace", MOE_EP_ERROR_INVALID_INPUT); });
  CHECK(start.first == MOE_EP_ERROR_INVALID_INPUT);
  CHECK_THAT(start.second, Contains("2 buffer slots") && Contains("overflow 64 bits"));
  CHECK(slot_start(uint64_t{1} << 62, 3, "w") == uint64_t{3} << 62);
}
