// The rank-failure scenarios of failure_policy MASK (docs/reliability.md,
// "Surviving a dead rank"), for any backend: 4 ranks as forked processes
// (fork_launcher.hpp), the store in a process of its own, each rank serving
// dispatch/combine rounds checked against the oracle on the routing masked
// by its handle's mask (masked_round.hpp), and reporting to the test through
// the store (Board).  A test case kills, stalls or replaces ranks and checks
// the reports: 0 wrong entries, detection <= timeout_ms + 1 s, the first
// masked round <= 2 s after detection, a rejoin <= 5 s.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fork_launcher.hpp"
#include "masked_round.hpp"
#include "moe_ep_c.h"
#include "store/store_client.hpp"
#include "workload.hpp"

namespace moe_ep_test {

constexpr int kWorld = 4;
constexpr int32_t kTimeoutMs = 1000;

// The workload every scenario serves (fresh inputs every round: round_spec).
moe_ep_verify::WorkloadSpec scenario_spec();

// What the ranks tell the test (through the store: the children share no memory).
class Board {
 public:
  explicit Board(const std::string& address) : client_(address, 5000) {}
  void put(const std::string& key, const std::string& value) {
    client_.set("t/" + key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  void put_number(const std::string& key, double v) { put(key, std::to_string(v)); }
  std::string get(const std::string& key, int64_t wait_ms = 0) {
    const auto v = client_.get("t/" + key, wait_ms);
    return v ? std::string(v->begin(), v->end()) : std::string();
  }
  double number(const std::string& key, double missing = -1) {
    const std::string s = get(key);
    return s.empty() ? missing : std::stod(s);
  }
  // Waits until every rank in `ranks` reported progress >= round.
  bool wait_progress(const std::vector<int>& ranks, int round, int timeout_ms) {
    const int64_t deadline = monotonic_ns() + int64_t(timeout_ms) * 1000000;
    for (;;) {
      bool all = true;
      for (int r : ranks) all = all && number("progress/" + std::to_string(r)) >= round;
      if (all) return true;
      if (monotonic_ns() > deadline) return false;
      usleep(2000);
    }
  }

 private:
  moe_ep::store::StoreClient client_;
};

// How a scenario's ranks make their handles: the config of rank `rank` over
// the store at `address` (failure_policy MASK), and, in the rank's process
// before create, where its rounds' tensors live (NULL: the host).
using RoundRunner = std::function<MaskedRound(moe_ep_handle_t h, const moe_ep_verify::WorkloadSpec& w)>;
struct RankSetup {
  std::function<moe_ep_config_t(const char* address, int rank)> config;
  std::function<RoundMemory(int rank)> memory;
  // In the rank's process, before create: how its rounds run (NULL:
  // run_masked_round over `memory`).
  std::function<RoundRunner(int rank)> rounds;
  // An asynchronous backend's survivors may find a failure one round apart (a
  // survivor whose round completed before the peer died finds it in its next
  // one): after each failure they restart together at the earliest round any
  // of them failed in, as a server's scheduler would re-issue the step.
  bool align_rounds_after_failure = false;
};

// What each rank of a scenario does besides serving rounds.
struct Script {
  int rounds = 600;
  int replaced = -1;     // the rank a replacement (or the rank itself, with a new handle) brings back
  int admit_round = -1;  // survivors admit it before this round
  int stall_rank = -1;   // sleeps 2.5 x timeout_ms before stall_round, without dying
  int stall_round = -1;
  int suicide_on_first_failure = -1;  // kills itself when its call returns the first failure
  int suicide_before_admission = -1;  // kills itself just before calling moe_ep_set_active_ranks
};

// An original rank: create over the store's bootstrap, then serve rounds.
int run_original_rank(const std::string& address, int rank, const Script& s, const RankSetup& setup);
// A replacement process (or a dropped rank's new handle): rejoin, then serve
// from the admission round.
int run_replacement_rank(const std::string& address, int rank, const Script& s, const RankSetup& setup);

// Collects and checks what every rank reported.
struct Outcome {
  std::map<std::string, double> worst;  // metric -> largest value over ranks
  int64_t wrong = 0, rounds = 0;
};

void check_reports(Board& board, const std::vector<int>& finishers, Outcome& out);
void check_bounds(const Outcome& out, bool rejoined);
void print_outcome(const Outcome& out);

// The launcher and its store, or a skip where this machine cannot fork or
// listen on the loopback interface.
std::unique_ptr<ForkLauncher> start_launcher();
// Every rank runs its original handle in a process of its own.
std::vector<pid_t> spawn_group(ForkLauncher& launcher, const Script& s, const RankSetup& setup);
// kill -9 of rank `victim` (process `pid`) once it reached `round`; the time
// is on the board for the survivors' detection delays.
void kill_at_round(ForkLauncher& launcher, Board& board, pid_t pid, int victim, int round);
// The scenarios every backend under MASK runs alike, each on a fresh launcher:
// kill -9 of rank 2 at round 300 of 1000, a replacement admitted at round
// 600, all 4 exact at the end; and rank 0 killed at round 100, rank 3 dying
// just before the survivors admit rank 0's replacement at round 250 (the
// admission abandoned on every side, tried again, 3 active at the end).
void kill_and_rejoin_scenario(ForkLauncher& launcher, const RankSetup& setup);
void failure_during_admission_scenario(ForkLauncher& launcher, const RankSetup& setup);
// The ranks other than a and b.
std::vector<int> others(int a, int b = -1);

}  // namespace moe_ep_test
