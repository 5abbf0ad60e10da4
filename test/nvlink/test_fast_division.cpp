// The kernels find an expert's owner with a multiply and a shift instead of a
// division; check the constants against `/` for many divisors and numerators.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>

#include "common/fast_division.h"

using moe_ep::kernels::compute_division_magic;
using moe_ep::kernels::divide_by_magic;

TEST_CASE("multiply-shift division equals integer division", "[division]") {
  std::mt19937 rng(7);
  for (uint32_t d = 1; d <= 1025; ++d) {
    uint32_t magic = 0, shift = 0;
    compute_division_magic(d, &magic, &shift);
    for (uint32_t n = 0; n < 3 * d + 20000; n += (n < 20000 ? 1 : d)) {
      if (divide_by_magic(n, magic, shift) != n / d) FAIL("divisor " << d << " numerator " << n);
    }
    for (int i = 0; i < 200; ++i) {
      const uint32_t n = rng();
      if (divide_by_magic(n, magic, shift) != n / d) FAIL("divisor " << d << " numerator " << n);
    }
    const uint32_t top = 0xFFFFFFFFu;
    REQUIRE(divide_by_magic(top, magic, shift) == top / d);
  }
  for (uint32_t d : {65535u, 65536u, 1000003u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu}) {
    uint32_t magic = 0, shift = 0;
    compute_division_magic(d, &magic, &shift);
    for (int i = 0; i < 100000; ++i) {
      const uint32_t n = rng();
      if (divide_by_magic(n, magic, shift) != n / d) FAIL("divisor " << d << " numerator " << n);
    }
  }
}
