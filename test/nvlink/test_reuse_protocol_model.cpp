// A model of the NVLink backend's buffer-reuse protocol, checked by
// enumerating every interleaving of the ranks' steps (docs/nvlink_backend.md,
// "One region per phase").  The protocol as the kernels run it:
//   dispatch: write rows (or padding) to every rank, count in at every rank,
//             wait for every rank, then the rows are consumed (experts);
//   combine:  tell every peer "started", push back the rows a peer sent here
//             and flag them, wait for the flags of the rows this rank needs,
//             reduce, and finish only after every peer's "started".
// It shows that one dispatch region and one combine region per rank suffice:
// no rank ever overwrites rows a peer has not consumed, reads rows of another
// call, republishes a flag its reader has not seen, or deadlocks.  It also
// shows that dropping the "started" handshake (flagging only the peers that
// got rows) breaks the argument.
#include <catch2/catch.hpp>

#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

enum class Op { WriteDispatch, FlagDispatch, WaitDispatch, ConsumeDispatch, FlagStarted, WriteCombine, FlagCombine,
                WaitCombine, ReduceCombine, WaitStarted };

struct Step {
  Op op;
  int round;
  int peer;
};

// rows(round, source, dest): whether `source` sends any token to `dest`.
using Routing = std::function<bool(int round, int source, int dest)>;

// The steps of one rank in program (stream) order.  A kernel's stores to a
// peer precede its flag to that peer; its waits precede its reads.
std::vector<Step> program(int me, int world, int rounds, const Routing& rows, bool without_started) {
  std::vector<Step> p;
  for (int n = 1; n <= rounds; ++n) {
    for (int d = 0; d < world; ++d) p.push_back({Op::WriteDispatch, n, d});  // rows or padding: always
    for (int d = 0; d < world; ++d) p.push_back({Op::FlagDispatch, n, d});
    for (int s = 0; s < world; ++s) p.push_back({Op::WaitDispatch, n, s});
    for (int s = 0; s < world; ++s) p.push_back({Op::ConsumeDispatch, n, s});  // counts, then the user's experts
    if (!without_started) {
      for (int s = 0; s < world; ++s) {
        if (s != me) p.push_back({Op::FlagStarted, n, s});
      }
    }
    for (int s = 0; s < world; ++s) {
      if (s != me && rows(n, s, me)) p.push_back({Op::WriteCombine, n, s});  // push back what s sent me
    }
    for (int s = 0; s < world; ++s) {
      if (s != me && rows(n, s, me)) p.push_back({Op::FlagCombine, n, s});
    }
    for (int q = 0; q < world; ++q) {
      if (q != me && rows(n, me, q)) p.push_back({Op::WaitCombine, n, q});
    }
    for (int q = 0; q < world; ++q) {
      if (q != me && rows(n, me, q)) p.push_back({Op::ReduceCombine, n, q});
    }
    if (!without_started) {
      for (int q = 0; q < world; ++q) {
        if (q != me) p.push_back({Op::WaitStarted, n, q});
      }
    }
  }
  return p;
}

// Per (owner, source) slot: the round whose rows are there and whether the
// owner has consumed them; per flag: the round published and the round seen.
struct Slot {
  int round = 0;
  bool consumed = true;
};
struct Flag {
  int published = 0;
  int seen = 0;
};

struct State {
  std::vector<size_t> pc;
  std::vector<Slot> dispatch_rows, combine_rows;  // [owner * world + source]
  std::vector<Flag> dispatch_flags, combine_flags, started_flags;

  std::string key() const {
    std::ostringstream os;
    for (size_t v : pc) os << v << ',';
    for (const auto* v : {&dispatch_rows, &combine_rows}) {
      for (const Slot& s : *v) os << s.round << s.consumed << ',';
    }
    for (const auto* v : {&dispatch_flags, &combine_flags, &started_flags}) {
      for (const Flag& f : *v) os << f.published << ':' << f.seen << ',';
    }
    return os.str();
  }
};

class Checker {
 public:
  Checker(int world, int rounds, const Routing& rows, bool without_started) : world_(world) {
    for (int r = 0; r < world; ++r) programs_.push_back(program(r, world, rounds, rows, without_started));
  }

  // "" if every interleaving is safe, else the first violation found.
  std::string run() {
    State s;
    s.pc.assign(world_, 0);
    s.dispatch_rows.assign(world_ * world_, Slot{});
    s.combine_rows.assign(world_ * world_, Slot{});
    s.dispatch_flags.assign(world_ * world_, Flag{});
    s.combine_flags.assign(world_ * world_, Flag{});
    s.started_flags.assign(world_ * world_, Flag{});
    std::vector<State> todo{s};
    std::set<std::string> seen{s.key()};
    while (!todo.empty()) {
      const State cur = todo.back();
      todo.pop_back();
      bool any = false, done = true;
      for (int r = 0; r < world_; ++r) {
        if (cur.pc[r] == programs_[r].size()) continue;
        done = false;
        State next = cur;
        std::string violation;
        if (!apply(r, programs_[r][cur.pc[r]], next, &violation)) continue;  // blocked in a wait
        if (!violation.empty()) return violation;
        any = true;
        ++next.pc[r];
        if (seen.insert(next.key()).second) todo.push_back(next);
      }
      if (!any && !done) return "deadlock";
      ++states_;
    }
    return "";
  }
  size_t states() const { return states_; }

 private:
  // Applies rank r's step; false if it must wait.  Sets *violation on a hazard.
  bool apply(int r, const Step& st, State& s, std::string* violation) {
    const auto at = [&](int owner, int source) { return static_cast<size_t>(owner * world_ + source); };
    std::ostringstream why;
    switch (st.op) {
      case Op::WriteDispatch: {
        Slot& slot = s.dispatch_rows[at(st.peer, r)];
        if (!slot.consumed) why << "rank " << r << " overwrites dispatch rows of round " << slot.round << " on rank "
                                << st.peer << " before they were consumed (round " << st.round << ")";
        slot = Slot{st.round, false};
        break;
      }
      case Op::FlagDispatch:
      case Op::FlagCombine:
      case Op::FlagStarted: {
        Flag& f = flags(s, st.op)[at(st.peer, r)];
        if (f.seen != f.published) why << "rank " << r << " republishes a flag rank " << st.peer << " has not seen";
        f.published = st.round;
        break;
      }
      case Op::WaitDispatch:
      case Op::WaitCombine:
      case Op::WaitStarted: {
        Flag& f = flags(s, st.op)[at(r, st.peer)];
        if (f.published < st.round) return false;
        if (f.published > st.round) why << "rank " << r << " sees a flag of a later round";
        f.seen = f.published;
        break;
      }
      case Op::ConsumeDispatch:
      case Op::ReduceCombine: {
        Slot& slot = (st.op == Op::ConsumeDispatch ? s.dispatch_rows : s.combine_rows)[at(r, st.peer)];
        if (slot.round != st.round) why << "rank " << r << " reads rows of round " << slot.round << " from rank "
                                        << st.peer << " in round " << st.round;
        slot.consumed = true;
        break;
      }
      case Op::WriteCombine: {
        Slot& slot = s.combine_rows[at(st.peer, r)];
        if (!slot.consumed) why << "rank " << r << " overwrites combine rows on rank " << st.peer;
        slot = Slot{st.round, false};
        break;
      }
    }
    *violation = why.str();
    return true;
  }

  static std::vector<Flag>& flags(State& s, Op op) {
    if (op == Op::FlagDispatch || op == Op::WaitDispatch) return s.dispatch_flags;
    if (op == Op::FlagCombine || op == Op::WaitCombine) return s.combine_flags;
    return s.started_flags;
  }

  int world_;
  std::vector<std::vector<Step>> programs_;
  size_t states_ = 0;
};

// Every routing of `rounds` rounds over `world` ranks where each rank keeps
// its own tokens (bit per ordered pair of distinct ranks and round).
std::vector<Routing> all_routings(int world, int rounds) {
  const int pairs = world * (world - 1);
  const int bits = pairs * rounds;
  std::vector<Routing> out;
  for (long mask = 0; mask < (1L << bits); ++mask) {
    out.push_back([=](int n, int s, int d) {
      if (s == d) return true;
      const int pair = s * (world - 1) + (d < s ? d : d - 1);
      return ((mask >> ((n - 1) * pairs + pair)) & 1) != 0;
    });
  }
  return out;
}

}  // namespace

TEST_CASE("one region per phase is safe with the started handshake (2 ranks, 3 rounds, all routings)",
          "[protocol]") {
  size_t states = 0;
  for (const Routing& routing : all_routings(2, 3)) {
    Checker c(2, 3, routing, false);
    REQUIRE(c.run() == "");
    states += c.states();
  }
  CHECK(states > 0);
}

TEST_CASE("one region per phase is safe with the started handshake (3 ranks, 2 rounds)", "[protocol]") {
  const std::vector<Routing> routings = all_routings(3, 2);
  // 4096 routings; every 37th covers all shapes of traffic while keeping the test fast.
  for (size_t i = 0; i < routings.size(); i += 37) {
    Checker c(3, 2, routings[i], false);
    INFO("routing " << i);
    REQUIRE(c.run() == "");
  }
  Checker everyone(3, 3, [](int, int, int) { return true; }, false);
  REQUIRE(everyone.run() == "");
  Checker nobody(3, 3, [](int, int s, int d) { return s == d; }, false);
  REQUIRE(nobody.run() == "");
}

TEST_CASE("without the started handshake a dispatch can overwrite unconsumed rows", "[protocol]") {
  bool found = false;
  for (const Routing& routing : all_routings(2, 2)) {
    Checker c(2, 2, routing, true);
    const std::string v = c.run();
    if (!v.empty()) {
      found = true;
      INFO(v);
      CHECK(v.find("overwrites dispatch rows") != std::string::npos);
      break;
    }
  }
  REQUIRE(found);
}
