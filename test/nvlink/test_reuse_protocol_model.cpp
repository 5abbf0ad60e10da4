// A model of the NVLink backend's buffer-reuse protocol as the kernels run it,
// checked by enumerating every interleaving of the ranks' steps
// (docs/nvlink_backend.md).  Each rank has one dispatch receive region, one
// combine receive region and, with config.zero_copy_combine, one combine_input
// view, reused by every call.  Per call:
//   dispatch (cuda/dispatch/receive.cuh): write rows or padding to every rank,
//     add to an arrival counter at every rank, wait for every rank's counter to
//     reach this call, then the rows are consumed (counts, the user's experts);
//   combine, serial push (combine_serial, and combine_small on the same
//     protocol): push back the rows each source sent here, add to an arrival
//     counter at every peer (rows or not), wait for every peer's counter, reduce;
//   combine, overlapped push (combine_overlapped): store "started N" at every
//     peer, push back the rows in phases, each counted in at every peer, reduce
//     the tokens whose phases landed (waiting only for the peers holding their
//     rows), and end after every peer's "started N";
//   combine, pull (cuda/combine/pull.cu, every call of a zero-copy group): the
//     experts (or the host copy, in stream order) write this rank's view after
//     its dispatch completed; store "started N" at every peer, wait for every
//     peer's "started N", then read the rows from the peers' views.
// Push calls may change schedule from call to call (the same on every rank in
// a call); both push schedules advance both kinds of counters.  The checker
// shows that no rank overwrites rows a peer has not consumed, reads rows of
// another call, or deadlocks, and that each weakened variant is caught.
// Not modelled: memory ordering (a step is atomic; the fences and acquires
// are assumed), the order of a kernel's blocks, the phases of the overlapped
// push (one phase per call), a rank's own rows (read locally in stream order).
#include <catch2/catch.hpp>

#include <functional>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

namespace {

enum class Op {
  WriteDispatch,
  FlagDispatch,
  WaitDispatch,
  ConsumeDispatch,
  WriteView,
  FlagStarted,
  WriteCombine,
  FlagCombine,
  WaitCombine,
  ReduceCombine,
  PullView,
  WaitStarted
};

enum class Schedule { Serial, Overlapped, Pull };

// The protocol as it runs, or one weakened variant of it.
enum class Variant {
  AsRuns,
  OverlappedWithoutStarted,  // the overlapped push neither stores nor waits for "started"
  SerialWaitsForSenders,     // the serial push waits only for the peers that push rows here
  PullBeforeStarted,         // the pull reads a peer's view before that peer's "started N"
  PullStartedFromSenders,    // the pull waits for "started N" only from the peers it reads
  ViewBeforeDispatch         // the experts write the view before this rank's dispatch completed
};

struct Step {
  Op op;
  int round;
  int peer;
};

// rows(round, source, dest): whether `source` sends any token to `dest`.
using Routing = std::function<bool(int round, int source, int dest)>;
// The combine schedule of every rank in `round`.
using Schedules = std::function<Schedule(int round)>;

// The steps of one rank in program (stream) order.  A kernel's stores to a
// peer precede its count or flag to that peer; its waits precede its reads.
std::vector<Step> program(int me, int world, int rounds, const Routing& rows, const Schedules& schedule, Variant v) {
  std::vector<Step> p;
  const auto each_peer = [&](Op op, int n, const std::function<bool(int)>& keep) {
    for (int q = 0; q < world; ++q) {
      if (q != me && keep(q)) p.push_back({op, n, q});
    }
  };
  const auto all = [](int) { return true; };
  for (int n = 1; n <= rounds; ++n) {
    const Schedule s = schedule(n);
    const auto sends_here = [&](int q) { return rows(n, q, me); };           // q's rows came here: push them back
    const auto holds_mine = [&](int q) { return rows(n, me, q); };           // q computed some of my tokens
    for (int d = 0; d < world; ++d) p.push_back({Op::WriteDispatch, n, d});  // rows or padding: always
    for (int d = 0; d < world; ++d) p.push_back({Op::FlagDispatch, n, d});
    if (s == Schedule::Pull && v == Variant::ViewBeforeDispatch) each_peer(Op::WriteView, n, all);
    for (int q = 0; q < world; ++q) p.push_back({Op::WaitDispatch, n, q});
    for (int q = 0; q < world; ++q) p.push_back({Op::ConsumeDispatch, n, q});  // counts, then the experts
    switch (s) {
      case Schedule::Serial:
        each_peer(Op::WriteCombine, n, sends_here);
        each_peer(Op::FlagCombine, n, all);
        if (v == Variant::SerialWaitsForSenders) {
          each_peer(Op::WaitCombine, n, holds_mine);
        } else {
          each_peer(Op::WaitCombine, n, all);
        }
        each_peer(Op::ReduceCombine, n, holds_mine);
        break;
      case Schedule::Overlapped:
        if (v != Variant::OverlappedWithoutStarted) each_peer(Op::FlagStarted, n, all);
        each_peer(Op::WriteCombine, n, sends_here);
        each_peer(Op::FlagCombine, n, all);
        each_peer(Op::WaitCombine, n, holds_mine);
        each_peer(Op::ReduceCombine, n, holds_mine);
        if (v != Variant::OverlappedWithoutStarted) each_peer(Op::WaitStarted, n, all);
        break;
      case Schedule::Pull:
        if (v != Variant::ViewBeforeDispatch) each_peer(Op::WriteView, n, all);
        each_peer(Op::FlagStarted, n, all);
        if (v == Variant::PullBeforeStarted) {
          each_peer(Op::PullView, n, holds_mine);
          each_peer(Op::WaitStarted, n, all);
        } else if (v == Variant::PullStartedFromSenders) {
          each_peer(Op::WaitStarted, n, holds_mine);
          each_peer(Op::PullView, n, holds_mine);
        } else {
          each_peer(Op::WaitStarted, n, all);
          each_peer(Op::PullView, n, holds_mine);
        }
        break;
    }
  }
  return p;
}

// Per (owner, source) slot: the round whose rows are there and whether the
// owner (or, for a view, the source) has consumed them.  Per counter or flag:
// the round it reached and the round its reader last saw.
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
  std::vector<Slot> dispatch_rows, combine_rows, view_rows;  // [owner * world + source]
  std::vector<Flag> dispatch_flags, combine_flags, started_flags;

  // Every field in one byte (program counters, rounds and counts stay far below 256).
  std::string key() const {
    std::string k;
    for (size_t v : pc) k.push_back(static_cast<char>(v));
    for (const auto* v : {&dispatch_rows, &combine_rows, &view_rows}) {
      for (const Slot& s : *v) k.push_back(static_cast<char>(s.round * 2 + (s.consumed ? 1 : 0)));
    }
    for (const auto* v : {&dispatch_flags, &combine_flags, &started_flags}) {
      for (const Flag& f : *v) {
        k.push_back(static_cast<char>(f.published));
        k.push_back(static_cast<char>(f.seen));
      }
    }
    return k;
  }
};

class Checker {
 public:
  Checker(int world, int rounds, const Routing& rows, const Schedules& schedule, Variant v = Variant::AsRuns)
      : world_(world), rows_(rows) {
    for (int r = 0; r < world; ++r) programs_.push_back(program(r, world, rounds, rows, schedule, v));
  }

  // "" if every interleaving is safe, else the first violation found,
  // followed by the interleaving that led to it (one step a line).
  std::string run() {
    State s;
    s.pc.assign(world_, 0);
    for (auto* v : {&s.dispatch_rows, &s.combine_rows, &s.view_rows}) v->assign(world_ * world_, Slot{});
    for (auto* v : {&s.dispatch_flags, &s.combine_flags, &s.started_flags}) v->assign(world_ * world_, Flag{});
    std::vector<Node> nodes{Node{s, 0, -1}};
    std::vector<size_t> todo{0};
    std::unordered_set<std::string> seen{s.key()};
    while (!todo.empty()) {
      const size_t at = todo.back();
      todo.pop_back();
      const State cur = nodes[at].state;
      bool any = false, done = true;
      for (int r = 0; r < world_; ++r) {
        if (cur.pc[r] == programs_[r].size()) continue;
        done = false;
        State next = cur;
        std::string violation;
        if (!apply(r, programs_[r][cur.pc[r]], next, &violation)) continue;  // blocked in a wait
        if (!violation.empty()) return violation + "\n" + trace(nodes, at) + step_name(r, cur) + "  <- here\n";
        any = true;
        ++next.pc[r];
        if (seen.insert(next.key()).second) {
          nodes.push_back(Node{next, at, r});
          todo.push_back(nodes.size() - 1);
        }
      }
      if (!any && !done) return "deadlock: " + describe(cur) + "\n" + trace(nodes, at);
      if (done) ++finished_;
    }
    return "";
  }
  // States where every rank has run every step of every round.
  size_t finished() const { return finished_; }

 private:
  // Applies rank r's step; false if it must wait.  Sets *violation on a hazard.
  bool apply(int r, const Step& st, State& s, std::string* violation) {
    const auto at = [&](int owner, int source) { return static_cast<size_t>(owner * world_ + source); };
    std::ostringstream why;
    switch (st.op) {
      case Op::WriteDispatch: {
        Slot& slot = s.dispatch_rows[at(st.peer, r)];
        if (!slot.consumed)
          why << "rank " << r << " overwrites dispatch rows of round " << slot.round << " on rank " << st.peer
              << " before they were consumed (round " << st.round << ")";
        slot = Slot{st.round, false};
        break;
      }
      case Op::FlagDispatch:
      case Op::FlagCombine:  // counters: one more call, seen or not
        ++flags(s, st.op)[at(st.peer, r)].published;
        break;
      case Op::FlagStarted: {  // a store of the call's number
        Flag& f = s.started_flags[at(st.peer, r)];
        f.published = st.round;
        break;
      }
      case Op::WaitDispatch:
      case Op::WaitCombine:
      case Op::WaitStarted: {  // until the value reaches this call
        Flag& f = flags(s, st.op)[at(r, st.peer)];
        if (f.published < st.round) return false;
        f.seen = st.round;
        break;
      }
      case Op::ConsumeDispatch:
      case Op::ReduceCombine: {
        Slot& slot = (st.op == Op::ConsumeDispatch ? s.dispatch_rows : s.combine_rows)[at(r, st.peer)];
        if (slot.round != st.round)
          why << "rank " << r << " reads rows of round " << slot.round << " from rank " << st.peer << " in round "
              << st.round;
        slot.consumed = true;
        break;
      }
      case Op::WriteCombine: {  // r pushes back into st.peer's combine region
        Slot& slot = s.combine_rows[at(st.peer, r)];
        if (!slot.consumed)
          why << "rank " << r << " overwrites combine rows of round " << slot.round << " on rank " << st.peer;
        slot = Slot{st.round, false};
        break;
      }
      case Op::WriteView: {  // r's experts write the rows of source st.peer into r's own view
        Slot& slot = s.view_rows[at(r, st.peer)];
        if (!slot.consumed)
          why << "rank " << r << " overwrites its combine_input rows of round " << slot.round << " (round " << st.round
              << ") before rank " << st.peer << " pulled them";
        slot = Slot{st.round, !rows_(st.round, st.peer, r)};  // pending only where the source has rows here
        break;
      }
      case Op::PullView: {  // r reads its rows from st.peer's view over NVLink
        Slot& slot = s.view_rows[at(st.peer, r)];
        if (slot.round != st.round)
          why << "rank " << r << " pulls combine_input rows of round " << slot.round << " from rank " << st.peer
              << " in round " << st.round;
        slot.consumed = true;
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

  struct Node {
    State state;
    size_t parent;
    int rank;  // who stepped into this state; -1 for the start
  };

  static const char* op_name(Op op) {
    static const char* const names[] = {"WriteDispatch", "FlagDispatch",  "WaitDispatch", "ConsumeDispatch",
                                        "WriteView",     "FlagStarted",   "WriteCombine", "FlagCombine",
                                        "WaitCombine",   "ReduceCombine", "PullView",     "WaitStarted"};
    return names[static_cast<int>(op)];
  }

  // Rank r's next step in state s, as "rank r round n Op peer p".
  std::string step_name(int r, const State& s) const {
    const Step& st = programs_[r][s.pc[r]];
    std::ostringstream os;
    os << "rank " << r << " round " << st.round << " " << op_name(st.op) << " peer " << st.peer;
    return os.str();
  }

  // The steps from the start to nodes[at], one a line.
  std::string trace(const std::vector<Node>& nodes, size_t at) const {
    std::vector<std::string> lines;
    for (size_t i = at; nodes[i].rank >= 0; i = nodes[i].parent) {
      lines.push_back(step_name(nodes[i].rank, nodes[nodes[i].parent].state));
    }
    std::string out;
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) out += *it + "\n";
    return out;
  }

  // Where every rank stands: its next step, or "done".
  std::string describe(const State& s) const {
    std::ostringstream os;
    for (int r = 0; r < world_; ++r) {
      if (s.pc[r] == programs_[r].size()) {
        os << "rank " << r << " done; ";
        continue;
      }
      os << step_name(r, s) << "; ";
    }
    return os.str();
  }

  int world_;
  Routing rows_;
  std::vector<std::vector<Step>> programs_;
  size_t finished_ = 0;
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

// Every sequence of push schedules over `rounds` rounds, and the pull (a
// zero-copy group pulls in every call).
std::vector<Schedules> all_schedules(int rounds) {
  std::vector<Schedules> out;
  for (long mask = 0; mask < (1L << rounds); ++mask) {
    out.push_back([=](int n) { return ((mask >> (n - 1)) & 1) != 0 ? Schedule::Overlapped : Schedule::Serial; });
  }
  out.push_back([](int) { return Schedule::Pull; });
  return out;
}

Schedule always_overlapped(int) { return Schedule::Overlapped; }
Schedule always_serial(int) { return Schedule::Serial; }
Schedule always_pull(int) { return Schedule::Pull; }

// The first violation the checker finds for variant v on 2 ranks, 2 rounds,
// over every routing with the schedule s in every round, or "".
std::string first_violation(Variant v, Schedule (*s)(int)) {
  for (const Routing& routing : all_routings(2, 2)) {
    const std::string found = Checker(2, 2, routing, s, v).run();
    if (!found.empty()) return found;
  }
  return "";
}

}  // namespace

TEST_CASE("buffer reuse: every schedule sequence is safe (2 ranks, 3 rounds, all routings)", "[protocol][reuse]") {
  const std::vector<Schedules> schedules = all_schedules(3);
  size_t runs = 0;
  for (const Routing& routing : all_routings(2, 3)) {
    for (const Schedules& schedule : schedules) {
      Checker c(2, 3, routing, schedule);
      REQUIRE(c.run() == "");
      REQUIRE(c.finished() == 1);  // the one end state: every rank ran every round
      ++runs;
    }
  }
  CHECK(runs == 64 * 9);
}

TEST_CASE("buffer reuse: every schedule is safe (3 ranks, 2 rounds)", "[protocol][reuse]") {
  const std::vector<Routing> routings = all_routings(3, 2);
  const std::vector<Schedules> schedules = all_schedules(2);
  // 4096 routings; every 13th, with the 5 schedule sequences in turn, covers
  // traffic of every shape while keeping the test within seconds.
  for (size_t i = 0; i < routings.size(); i += 13) {
    const Schedules& schedule = schedules[i % schedules.size()];
    Checker c(3, 2, routings[i], schedule);
    INFO("routing " << i);
    REQUIRE(c.run() == "");
    REQUIRE(c.finished() == 1);
  }
  for (Schedule (*s)(int) : {always_serial, always_overlapped, always_pull}) {
    Checker everyone(
        3, 3, [](int, int, int) { return true; }, s);
    REQUIRE(everyone.run() == "");
    Checker nobody(
        3, 3, [](int, int src, int dst) { return src == dst; }, s);
    REQUIRE(nobody.run() == "");
  }
}

TEST_CASE("buffer reuse: every weakened variant is caught", "[protocol][reuse]") {
  struct Case {
    Variant variant;
    Schedule (*schedule)(int);
    const char* name;
    const char* expect;
  };
  const Case cases[] = {
      {Variant::OverlappedWithoutStarted, always_overlapped, "overlapped push without started",
       "overwrites dispatch rows"},
      {Variant::SerialWaitsForSenders, always_serial, "serial push waiting only for senders",
       "overwrites dispatch rows"},
      {Variant::PullBeforeStarted, always_pull, "pull before started", "pulls combine_input rows of round 0"},
      {Variant::PullStartedFromSenders, always_pull, "pull waiting for started only from pulled peers",
       "overwrites dispatch rows"},
      {Variant::ViewBeforeDispatch, always_pull, "view written before the dispatch completed",
       "overwrites its combine_input rows"},
  };
  for (const Case& c : cases) {
    const std::string v = first_violation(c.variant, c.schedule);
    INFO(c.name << ":\n" << v);
    REQUIRE(!v.empty());
    CHECK(v.find(c.expect) != std::string::npos);
  }
}
