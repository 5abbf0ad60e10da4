#include "rank_failure_scenario.hpp"

#include <signal.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "case_skip.hpp"
#include "host_case_runner.hpp"
#include "small_workload.hpp"

namespace moe_ep_test {

namespace {

double ms_between(int64_t from_ns, int64_t to_ns) { return double(to_ns - from_ns) / 1e6; }

}  // namespace

WorkloadSpec scenario_spec() { return small_workload(kWorld, 20261202); }

namespace {

int die_now(Board& board, int rank) {
  board.put("killed_at/" + std::to_string(rank), std::to_string(monotonic_ns()));
  kill(getpid(), SIGKILL);
  return 9;
}

class Rank {
 public:
  Rank(const std::string& address, int rank, const Script& s, const RankSetup& setup)
      : address_(address),
        rank_(rank),
        s_(s),
        setup_(setup),
        board_(address),
        memory_(setup.memory ? setup.memory(rank) : host_round_memory()),
        rounds_(setup.rounds ? setup.rounds(rank) : RoundRunner{}) {}

  // An original rank: create over the store's bootstrap, then serve rounds.
  int run_original() {
    moe_ep_bootstrap_t b;
    moe_ep_bootstrap_init(&b, sizeof b);
    if (moe_ep_bootstrap_from_store(address_.c_str(), "boot", rank_, kWorld, 20000, &b) != MOE_EP_SUCCESS) {
      return report(std::string("bootstrap: ") + moe_ep_last_error());
    }
    const moe_ep_config_t c = setup_.config(address_.c_str(), rank_);
    moe_ep_params_t p = scenario_spec().params();
    if (moe_ep_create(&b, &p, &c, &h_) != MOE_EP_SUCCESS) return report(std::string("create: ") + moe_ep_last_error());
    const int code = serve(0);
    moe_ep_destroy(&h_);
    moe_ep_bootstrap_release(&b);
    return code;
  }

  // A replacement process (or a dropped rank's new handle): rejoin, then serve from the admission round.
  int run_replacement() {
    if (!board_.wait_progress({lowest_survivor()}, s_.admit_round - 2, 60000)) return report("survivors too slow");
    for (int attempt = 0; attempt < 4 && h_ == nullptr; ++attempt) {
      board_.put("replacement_started", "1");
      const int64_t t0 = monotonic_ns();
      moe_ep_bootstrap_t b;
      moe_ep_bootstrap_init(&b, sizeof b);
      b.rank = rank_;
      b.world_size = kWorld;  // no callbacks: the group is met through the store
      moe_ep_config_t c = setup_.config(address_.c_str(), rank_);
      c.rejoin = 1;
      moe_ep_params_t p = scenario_spec().params();
      const moe_ep_status_t rc = moe_ep_create(&b, &p, &c, &h_);
      if (rc == MOE_EP_SUCCESS) {
        board_.put_number("rejoin_ms/" + std::to_string(rank_), ms_between(t0, monotonic_ns()));
      } else {
        board_.put("rejoin_refused/" + std::to_string(attempt), moe_ep_last_error());
      }
    }
    if (h_ == nullptr) return report("rejoin failed: " + board_.get("rejoin_refused/3"));
    const int code = serve(s_.admit_round);
    moe_ep_destroy(&h_);
    return code;
  }

 private:
  int lowest_survivor() const { return rank_ == 0 ? 1 : 0; }

  int report(const std::string& problem) {
    board_.put("error/" + std::to_string(rank_), problem);
    return 1;
  }

  // A failure the survivors masked: when it was seen, and which rank it named.
  void note_failure() {
    const moe_ep_health_t hh = poll_health(h_);
    const std::string victim = std::to_string(hh.failed_rank);
    const std::string at = board_.get("killed_at/" + victim, 5000);
    const std::string n = std::to_string(failures_++);
    board_.put("failed_rank/" + std::to_string(rank_) + "/" + n, victim);
    if (!at.empty()) {
      // The restart alignment after an earlier failure is the scheduler's
      // wait, not detection: a peer that died before posting its round
      // holds it up to its bound.
      const int64_t killed = std::stoll(at);
      const int64_t from = std::max(align_start_ns_, killed);
      const double aligned_ms = align_end_ns_ > from ? ms_between(from, align_end_ns_) : 0;
      board_.put_number("detect_ms/" + std::to_string(rank_) + "/" + n,
                        ms_between(killed, monotonic_ns()) - aligned_ms);
    }
    detected_ns_ = monotonic_ns();
  }

  // After the survivors' failures_-th failure: every survivor posts the round
  // it failed in and restarts at the earliest (a survivor that does not post
  // within 2 x timeout_ms is left out: it failed too, the next round finds
  // it).  The wait is the harness's own (a server's scheduler), so the first
  // masked round is timed from its end.
  int aligned_round(int round) {
    const int64_t start = monotonic_ns();
    const std::string n = std::to_string(failures_);
    board_.put("failed_round/" + n + "/" + std::to_string(rank_), std::to_string(round));
    std::vector<uint8_t> mask(kWorld);
    moe_ep_get_active_ranks(h_, mask.data(), kWorld);
    int earliest = round;
    for (int r = 0; r < kWorld; ++r) {
      if (r == rank_ || !mask[size_t(r)]) continue;
      const std::string theirs = board_.get("failed_round/" + n + "/" + std::to_string(r), 2 * kTimeoutMs);
      if (!theirs.empty()) earliest = std::min(earliest, std::stoi(theirs));
    }
    align_start_ns_ = start;
    align_end_ns_ = monotonic_ns();
    detected_ns_ += align_end_ns_ - start;
    return earliest;
  }

  // Survivors: bring s_.replaced back (retrying when a peer fails during the change).
  bool admit() {
    board_.get("replacement_started", 60000);
    if (rank_ == s_.suicide_before_admission) die_now(board_, rank_);
    for (int attempt = 0; attempt < 4; ++attempt) {
      std::vector<uint8_t> mask(kWorld);
      moe_ep_get_active_ranks(h_, mask.data(), kWorld);
      mask[size_t(s_.replaced)] = 1;
      const int64_t t0 = monotonic_ns();
      const moe_ep_status_t rc = moe_ep_set_active_ranks(h_, mask.data(), kWorld);
      if (rc == MOE_EP_SUCCESS) {
        board_.put_number("admit_ms/" + std::to_string(rank_), ms_between(t0, monotonic_ns()));
        return true;
      }
      if (rc != MOE_EP_ERROR_TIMEOUT || poll_health(h_).status != MOE_EP_SUCCESS) {
        report(std::string("set_active_ranks: ") + moe_ep_last_error());
        return false;
      }
      note_failure();  // a peer failed during the mask change: masked, try again
    }
    report("admission did not succeed in 4 attempts");
    return false;
  }

  int serve(int first_round) {
    int64_t wrong = 0, rounds_run = 0;
    for (int round = first_round; round < s_.rounds;) {
      if (round == s_.admit_round && rank_ != s_.replaced && !admit()) return 1;
      if (rank_ == s_.stall_rank && round == s_.stall_round) {
        board_.put("killed_at/" + std::to_string(rank_), std::to_string(monotonic_ns()));
        std::this_thread::sleep_for(std::chrono::milliseconds(kTimeoutMs * 5 / 2));
      }
      const moe_ep_verify::WorkloadSpec w = round_spec(scenario_spec(), round);
      const MaskedRound m = rounds_ ? rounds_(h_, w) : run_masked_round(h_, w, rank_, memory_);
      if (m.status != MOE_EP_SUCCESS) {
        if (m.pending) continue;  // found after the round: its next call recovers (and returns TIMEOUT)
        const moe_ep_health_t hh = poll_health(h_);
        if (m.status == MOE_EP_ERROR_TIMEOUT && hh.status == MOE_EP_SUCCESS) {
          if (rank_ == s_.suicide_on_first_failure) return die_now(board_, rank_);
          note_failure();
          if (setup_.align_rounds_after_failure) round = aligned_round(round);
          continue;  // the round again, under the new mask
        }
        if (rank_ == s_.stall_rank && hh.status == MOE_EP_ERROR_TIMEOUT) {
          board_.put("dropped/" + std::to_string(rank_), m.error);
          board_.put("wrong_before_drop/" + std::to_string(rank_), std::to_string(wrong));
          return 0;  // dropped by its peers, as it must be: rejoins with a new handle
        }
        return report("round " + std::to_string(round) + ": " + m.error);
      }
      if (m.wrong && wrong == 0) board_.put("wrong_details/" + std::to_string(rank_), m.details);
      wrong += m.wrong;
      ++rounds_run;
      if (detected_ns_ != 0) {
        board_.put_number("first_masked_ms/" + std::to_string(rank_), ms_between(detected_ns_, monotonic_ns()));
        detected_ns_ = 0;
      }
      board_.put("progress/" + std::to_string(rank_), std::to_string(++round));
    }
    const moe_ep_health_t hh = poll_health(h_);
    board_.put("final/" + std::to_string(rank_),
               std::to_string(hh.active_count) + " active, epoch " + std::to_string(hh.mask_epoch));
    board_.put("wrong/" + std::to_string(rank_), std::to_string(wrong));
    board_.put("rounds/" + std::to_string(rank_), std::to_string(rounds_run));
    return 0;
  }

  std::string address_;
  int rank_;
  Script s_;
  RankSetup setup_;
  Board board_;
  RoundMemory memory_;
  RoundRunner rounds_;
  moe_ep_handle_t h_ = nullptr;
  int failures_ = 0;
  int64_t detected_ns_ = 0;
  int64_t align_start_ns_ = 0, align_end_ns_ = 0;  // the last restart alignment
};

}  // namespace

int run_original_rank(const std::string& address, int rank, const Script& s, const RankSetup& setup) {
  return Rank(address, rank, s, setup).run_original();
}

int run_replacement_rank(const std::string& address, int rank, const Script& s, const RankSetup& setup) {
  return Rank(address, rank, s, setup).run_replacement();
}

void check_reports(Board& board, const std::vector<int>& finishers, Outcome& out) {
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << " error: " << board.get("error/" + std::to_string(r)));
    CHECK(board.get("error/" + std::to_string(r)).empty());
  }
  for (int r : finishers) {
    INFO("rank " << r << ": " << board.get("wrong_details/" + std::to_string(r)));
    REQUIRE(!board.get("wrong/" + std::to_string(r)).empty());
    out.wrong += std::stoll(board.get("wrong/" + std::to_string(r)));
    out.rounds += std::stoll(board.get("rounds/" + std::to_string(r)));
    CHECK(board.get("final/" + std::to_string(r)).find("4 active") == 0);
  }
  for (const char* metric : {"detect_ms", "first_masked_ms", "rejoin_ms", "admit_ms"}) {
    for (int r = 0; r < kWorld; ++r) {
      for (int n = -1; n < 3; ++n) {
        const std::string key = std::string(metric) + "/" + std::to_string(r) + (n < 0 ? "" : "/" + std::to_string(n));
        const double v = board.number(key);
        if (v >= 0 && v > out.worst[metric]) out.worst[metric] = v;
      }
    }
  }
  std::printf("  %lld rounds served by the finishing ranks, %lld wrong entries\n", (long long)out.rounds,
              (long long)out.wrong);
  for (const auto& m : out.worst) std::printf("  worst %s: %.1f ms\n", m.first.c_str(), m.second);
}

void check_bounds(const Outcome& out, bool rejoined) {
  CHECK(out.wrong == 0);
  REQUIRE(out.worst.count("detect_ms"));
  CHECK(out.worst.at("detect_ms") <= kTimeoutMs + 1000);
  REQUIRE(out.worst.count("first_masked_ms"));
  CHECK(out.worst.at("first_masked_ms") <= 2000);
  if (rejoined) {
    REQUIRE(out.worst.count("rejoin_ms"));
    CHECK(out.worst.at("rejoin_ms") <= 5000);
    CHECK(out.worst.at("admit_ms") <= 5000);
  }
}

// The launcher and its store, or a skip where this machine cannot fork or
// listen on the loopback interface.
std::unique_ptr<ForkLauncher> start_launcher() {
  try {
    return std::make_unique<ForkLauncher>();
  } catch (const std::exception& e) {
    skip_case(std::string("no fork launcher here: ") + e.what());
    return nullptr;
  }
}

// Every rank runs its original handle (Rank::run_original) in a process of its own.
std::vector<pid_t> spawn_group(ForkLauncher& launcher, const Script& s, const RankSetup& setup) {
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pids.push_back(launcher.spawn([&, r] { return run_original_rank(launcher.store_address(), r, s, setup); }));
  }
  return pids;
}

// kill -9 of rank `victim` (process `pid`) once it reached `round`; the time
// is on the board for the survivors' detection delays.
void kill_at_round(ForkLauncher& launcher, Board& board, pid_t pid, int victim, int round) {
  REQUIRE(board.wait_progress({victim}, round, 60000));
  board.put("killed_at/" + std::to_string(victim), std::to_string(monotonic_ns()));
  launcher.kill_now(pid);
}

void print_outcome(const Outcome& out) {
  for (const auto& m : out.worst) std::printf("  worst %s: %.1f ms\n", m.first.c_str(), m.second);
  std::printf("  %lld rounds, %lld wrong entries\n", (long long)out.rounds, (long long)out.wrong);
}

namespace {

// kill -9 of rank s.replaced at `round`; once the survivors near
// s.admit_round, its replacement process.  Returns the replacement's pid.
pid_t kill_then_replace(ForkLauncher& launcher, Board& board, const Script& s, const RankSetup& setup,
                        const std::vector<pid_t>& pids, int round) {
  const int victim = s.replaced;
  kill_at_round(launcher, board, pids[size_t(victim)], victim, round);
  REQUIRE(board.wait_progress(others(victim), s.admit_round - 2, 120000));
  return launcher.spawn([&] { return run_replacement_rank(launcher.store_address(), victim, s, setup); });
}

}  // namespace

void kill_and_rejoin_scenario(ForkLauncher& launcher, const RankSetup& setup) {
  Script s;
  s.rounds = 1000;
  s.replaced = 2;
  s.admit_round = 600;
  const std::vector<pid_t> pids = spawn_group(launcher, s, setup);
  Board board(launcher.store_address());
  const pid_t replacement = kill_then_replace(launcher, board, s, setup, pids, 300);
  for (int r : others(2)) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  CHECK(launcher.wait_exit(replacement, 240000) == 0);
  for (int r : others(2)) CHECK(board.get("failed_rank/" + std::to_string(r) + "/0") == "2");
  Outcome out;
  check_reports(board, {0, 1, 2, 3}, out);
  check_bounds(out, true);
}

void failure_during_admission_scenario(ForkLauncher& launcher, const RankSetup& setup) {
  Script s;
  s.rounds = 400;
  s.replaced = 0;
  s.admit_round = 250;
  s.suicide_before_admission = 3;
  const std::vector<pid_t> pids = spawn_group(launcher, s, setup);
  Board board(launcher.store_address());
  const pid_t replacement = kill_then_replace(launcher, board, s, setup, pids, 100);
  CHECK(launcher.wait_exit(pids[3], 120000) == 128 + SIGKILL);
  for (int r : others(0, 3)) CHECK(launcher.wait_exit(pids[size_t(r)], 240000) == 0);
  CHECK(launcher.wait_exit(replacement, 240000) == 0);
  INFO("the replacement's first attempt: " << board.get("rejoin_refused/0"));
  CHECK(board.get("rejoin_refused/0").find("abandoned") != std::string::npos);
  Outcome out;
  for (int r : {0, 1, 2}) {
    CHECK(board.get("error/" + std::to_string(r)).empty());
    CHECK(board.get("final/" + std::to_string(r)).find("3 active") == 0);
    out.wrong += std::stoll(board.get("wrong/" + std::to_string(r)));
    out.rounds += std::stoll(board.get("rounds/" + std::to_string(r)));
  }
  for (int r : {1, 2}) {
    CHECK(board.get("failed_rank/" + std::to_string(r) + "/1") == "3");
    for (int n = 0; n < 2; ++n) {
      out.worst["detect_ms"] =
          std::max(out.worst["detect_ms"], board.number("detect_ms/" + std::to_string(r) + "/" + std::to_string(n)));
    }
    out.worst["first_masked_ms"] =
        std::max(out.worst["first_masked_ms"], board.number("first_masked_ms/" + std::to_string(r)));
    out.worst["admit_ms"] = std::max(out.worst["admit_ms"], board.number("admit_ms/" + std::to_string(r)));
  }
  out.worst["rejoin_ms"] = board.number("rejoin_ms/0");
  print_outcome(out);
  check_bounds(out, true);
}

std::vector<int> others(int a, int b) {
  std::vector<int> v;
  for (int r = 0; r < kWorld; ++r) {
    if (r != a && r != b) v.push_back(r);
  }
  return v;
}

}  // namespace moe_ep_test
