// Catch2 main for single-process test executables: exit code 77 (CTest:
// skipped) when a case was skipped and none failed (case_skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "case_skip.hpp"

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  return moe_ep_test::test_exit_code(failed != 0, moe_ep_test::skipped_cases() > 0);
}
