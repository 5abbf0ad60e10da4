// Checks made on the rank threads of run_ranks (thread_bootstrap.hpp), asserted
// on the main thread: Catch2 v2's assertion macros are not thread-safe, so a
// rank thread only records what it found, and the test asserts it after the
// join.
//
//   RankChecks checks;
//   run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
//     RANK_REQUIRE(checks, rank, create(b) == MOE_EP_SUCCESS);  // false: this rank's body returns
//     RANK_CHECK(checks, rank, h == nullptr);
//   });
//   checks.assert_all();  // one CHECK (or REQUIRE) per recorded condition, in record order
#pragma once

#include <catch2/catch.hpp>
#include <mutex>
#include <string>
#include <vector>

namespace moe_ep_test {

class RankChecks {
 public:
  // Thread-safe; returns `ok`.
  bool record(int rank, bool ok, bool required, const char* expression, const char* file, int line) {
    std::lock_guard<std::mutex> lock(mutex_);
    results_.push_back(Result{rank, ok, required, expression, file, line});
    return ok;
  }

  // On the test's thread, after run_ranks returned.
  void assert_all() const {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Result& r : results_) {
      INFO("rank " << r.rank << ", " << r.file << ":" << r.line << ": " << r.expression);
      if (r.required) {
        REQUIRE(r.ok);
      } else {
        CHECK(r.ok);
      }
    }
  }

 private:
  struct Result {
    int rank;
    bool ok;
    bool required;
    std::string expression;
    const char* file;
    int line;
  };
  mutable std::mutex mutex_;
  std::vector<Result> results_;
};

}  // namespace moe_ep_test

// On a rank thread: records the condition; RANK_REQUIRE also ends the rank's
// body when it is false (as REQUIRE would, by its exception).
#define RANK_CHECK(checks, rank, ...) \
  (checks).record((rank), static_cast<bool>(__VA_ARGS__), false, #__VA_ARGS__, __FILE__, __LINE__)
#define RANK_REQUIRE(checks, rank, ...)                                                                           \
  do {                                                                                                            \
    if (!(checks).record((rank), static_cast<bool>(__VA_ARGS__), true, #__VA_ARGS__, __FILE__, __LINE__)) return; \
  } while (0)
