// The active-rank mask as the NVLink dispatch kernels read it
// (src/gpu/routing_mask.hpp).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "gpu/routing_mask.hpp"

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

TEST_CASE("absent ranks (failure_policy MASK): the inactive peers, never this rank", "[routing_mask]") {
  using moe_ep::absent_ranks;
  CHECK(absent_ranks({1, 1, 1, 1}, 1) == 0);
  CHECK(absent_ranks({1, 0, 1, 0}, 0) == 0b1010u);
  CHECK(absent_ranks({1, 0, 1, 0}, 2) == 0b1010u);
  std::vector<uint8_t> wide(64, 1);
  wide[63] = 0;
  CHECK(absent_ranks(wide, 5) == uint64_t{1} << 63);
}

TEST_CASE("absent ranks: an inactive rank runs alone, every other rank absent", "[routing_mask]") {
  using moe_ep::absent_ranks;
  CHECK(absent_ranks({1, 0, 1}, 1) == 0b101u);
  CHECK(absent_ranks({0, 1, 1, 1}, 0) == 0b1110u);
  CHECK(absent_ranks({0}, 0) == 0);  // one rank: nobody to be absent
  // Every absent rank is masked too (masked_ranks is a superset).
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<uint8_t> active{1, 0, 1, 1};
    const uint64_t absent = absent_ranks(active, rank);
    CHECK((absent & moe_ep::masked_ranks(active, rank)) == absent);
  }
}
