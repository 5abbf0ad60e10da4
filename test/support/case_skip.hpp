// Skipped test cases.  Catch2 v2 has no SKIP: a test case whose precondition is
// missing calls skip_case(reason) and returns.  The reason is printed, and the
// mains of the test executables (catch_main.cpp, catch_main_mpi.cpp,
// test/nvlink/gpu_test_main.cpp) exit with kSkipExitCode instead of 0 when no
// case failed, so CTest (SKIP_RETURN_CODE 77) reports the run as skipped: a
// missing precondition never counts as a pass.  CTest registrations leave out,
// by tag, the cases that cannot run in their setting (say a two-rank case in a
// one-rank run), so that a skip means the machine lacks what the case needs.
#pragma once

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

namespace moe_ep_test {

constexpr int kSkipExitCode = 77;

// How many skip_case calls this process has made.
inline std::atomic<int> g_skipped_cases{0};
inline int skipped_cases() { return g_skipped_cases.load(); }

// Records that the running test case is skipped, and why (printed at once, and
// as a Catch2 warning in the case's report).  Call it on the thread that runs
// the case.
inline void skip_case(const std::string& reason) {
  g_skipped_cases.fetch_add(1);
  std::printf("SKIPPED: %s: %s\n", Catch::getResultCapture().getCurrentTestName().c_str(), reason.c_str());
  std::fflush(stdout);
  WARN("skipped: " << reason);
}

// The exit code of a test executable: 1 if `failed` (Catch::Session::run's
// result, or any rank's), else kSkipExitCode if `skipped`, else 0.
inline int test_exit_code(bool failed, bool skipped) { return failed ? 1 : skipped ? kSkipExitCode : 0; }

}  // namespace moe_ep_test
