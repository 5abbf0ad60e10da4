// The active-rank mask as the NVLink dispatch kernels read it
// (src/nvlink/routing_mask.hpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "nvlink/routing_mask.hpp"

using moe_ep::masked_ranks;

TEST_CASE("routing mask: every rank active masks nothing", "[routing_mask]") {
  CHECK(masked_ranks({1}, 0) == 0);
  CHECK(masked_ranks({1, 1, 1, 1}, 2) == 0);
}

TEST_CASE("routing mask: an inactive peer's bit is set, the others are not", "[routing_mask]") {
  CHECK(masked_ranks({1, 0, 1, 0}, 0) == 0b1010u);
  CHECK(masked_ranks({0, 1, 1, 1}, 3) == 0b0001u);
  std::vector<uint8_t> wide(64, 1);
  wide[63] = 0;
  CHECK(masked_ranks(wide, 0) == uint64_t{1} << 63);
}

TEST_CASE("routing mask: an inactive rank masks every pick of its own", "[routing_mask]") {
  CHECK(masked_ranks({1, 0}, 1) == ~uint64_t{0});
  CHECK(masked_ranks({0, 1, 1}, 0) == ~uint64_t{0});
}
