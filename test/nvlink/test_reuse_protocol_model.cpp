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
//
// The zero-copy pull combine (docs/nvlink_backend.md, "What is left") is
// modelled too: a rank that passes its combine_input view has its experts
// write, after its dispatch, the rows of every source into its own region;
// its combine kernel publishes "started" with that bit, pushes only when it
// did not pass the view, and advances every peer's combine counter each call;
// a source pulls from a peer's region after it read that peer's "started"
// (and its bit), waits for pushed rows from the others, and finishes after
// every peer's "started".  Also its all-or-nothing fallback (pull only in a
// call where every rank set the bit).  Weakened variants must be caught.
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

// The protocol a rank runs.  Push and PushWithoutStarted are today's kernels
// (the second a weakened variant); Pull is the zero-copy combine as proposed,
// the Pull* variants each drop one of its conditions.
enum class Protocol {
  Push,
  PushWithoutStarted,
  Pull,
  PullAllOrNothing,          // pulls only in calls where every rank passed its view, else everyone pushes
  PullBeforeStarted,         // pulls from d without first reading d's "started N"
  PullViewBeforeDispatch,    // d's experts write the view before d's dispatch N completed
  PullIgnoringBit,           // pulls from every peer, whether it passed its view or not
  PullWithoutAdvancing,      // the pull path does not advance the combine counters
  PullStartedOnlyFromPulled  // waits for "started N" only from the peers it pulls from
};

bool is_pull(Protocol p) { return p != Protocol::Push && p != Protocol::PushWithoutStarted; }

struct Step {
  Op op;
  int round;
  int peer;
};

// rows(round, source, dest): whether `source` sends any token to `dest`.
using Routing = std::function<bool(int round, int source, int dest)>;
// views(round, rank): whether `rank` passes its combine_input view in `round`.
using Views = std::function<bool(int round, int rank)>;

// Whether the sources pull from `owner`'s view in round n (else it pushes).
bool pulled_from(int world, int n, int owner, const Views& views, Protocol v) {
  if (v != Protocol::PullAllOrNothing) return views(n, owner);
  for (int r = 0; r < world; ++r) {
    if (!views(n, r)) return false;
  }
  return true;
}

// The steps of one rank in program (stream) order.  A kernel's stores to a
// peer precede its flag to that peer; its waits precede its reads.
std::vector<Step> push_program(int me, int world, int rounds, const Routing& rows, bool without_started) {
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

// The zero-copy pull combine.  Its combine counters count calls (every call
// adds one at every peer, rows or not), so a skipped advance shows up as a
// wait that never ends.
std::vector<Step> pull_program(int me, int world, int rounds, const Routing& rows, const Views& views, Protocol v) {
  std::vector<Step> p;
  const auto write_view = [&](int n) {
    for (int s = 0; s < world; ++s) {
      if (s != me) p.push_back({Op::WriteView, n, s});  // experts: rows [s*tpr, (s+1)*tpr) of my region
    }
  };
  for (int n = 1; n <= rounds; ++n) {
    const bool my_view = views(n, me);
    for (int d = 0; d < world; ++d) p.push_back({Op::WriteDispatch, n, d});
    for (int d = 0; d < world; ++d) p.push_back({Op::FlagDispatch, n, d});
    if (my_view && v == Protocol::PullViewBeforeDispatch) write_view(n);
    for (int s = 0; s < world; ++s) p.push_back({Op::WaitDispatch, n, s});
    for (int s = 0; s < world; ++s) p.push_back({Op::ConsumeDispatch, n, s});
    if (my_view && v != Protocol::PullViewBeforeDispatch) write_view(n);
    // Combine kernel start: "started N" with the view bit to every peer.
    for (int q = 0; q < world; ++q) {
      if (q != me) p.push_back({Op::FlagStarted, n, q});
    }
    const bool i_push = !pulled_from(world, n, me, views, v);
    if (v == Protocol::PullAllOrNothing) {  // every rank's bit decides the path
      for (int q = 0; q < world; ++q) {
        if (q != me) p.push_back({Op::WaitStarted, n, q});
      }
    }
    if (i_push) {
      for (int s = 0; s < world; ++s) {
        if (s != me && rows(n, s, me)) p.push_back({Op::WriteCombine, n, s});
      }
    }
    if (i_push || v != Protocol::PullWithoutAdvancing) {
      for (int q = 0; q < world; ++q) {
        if (q != me) p.push_back({Op::FlagCombine, n, q});
      }
    }
    for (int q = 0; q < world; ++q) {
      if (q == me || !rows(n, me, q)) continue;
      if (v != Protocol::PullBeforeStarted) p.push_back({Op::WaitStarted, n, q});  // reads q's view bit
      if (pulled_from(world, n, q, views, v) || v == Protocol::PullIgnoringBit) {
        p.push_back({Op::PullView, n, q});
      } else {
        p.push_back({Op::WaitCombine, n, q});
        p.push_back({Op::ReduceCombine, n, q});
      }
    }
    for (int q = 0; q < world; ++q) {
      if (q == me) continue;
      if (v == Protocol::PullStartedOnlyFromPulled && !(rows(n, me, q) && views(n, q))) continue;
      p.push_back({Op::WaitStarted, n, q});
    }
  }
  return p;
}

std::vector<Step> program(int me, int world, int rounds, const Routing& rows, const Views& views, Protocol v) {
  if (is_pull(v)) return pull_program(me, world, rounds, rows, views, v);
  return push_program(me, world, rounds, rows, v == Protocol::PushWithoutStarted);
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
  Checker(int world, int rounds, const Routing& rows, bool without_started)
      : Checker(world, rounds, rows, no_views, without_started ? Protocol::PushWithoutStarted : Protocol::Push) {}
  Checker(int world, int rounds, const Routing& rows, const Views& views, Protocol v)
      : world_(world), rows_(rows), views_(views), protocol_(v), counting_(is_pull(v)) {
    for (int r = 0; r < world; ++r) programs_.push_back(program(r, world, rounds, rows, views, v));
  }

  // "" if every interleaving is safe, else the first violation found,
  // followed by the interleaving that led to it (one step a line).
  std::string run() {
    State s;
    s.pc.assign(world_, 0);
    s.dispatch_rows.assign(world_ * world_, Slot{});
    s.combine_rows.assign(world_ * world_, Slot{});
    s.view_rows.assign(world_ * world_, Slot{});
    s.dispatch_flags.assign(world_ * world_, Flag{});
    s.combine_flags.assign(world_ * world_, Flag{});
    s.started_flags.assign(world_ * world_, Flag{});
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
      ++states_;
    }
    return "";
  }
  size_t states() const { return states_; }
  // States where every rank has run every step of every round.
  size_t finished() const { return finished_; }

 private:
  // Applies rank r's step; false if it must wait.  Sets *violation on a hazard.
  bool apply(int r, const Step& st, State& s, std::string* violation) {
    const auto at = [&](int owner, int source) { return static_cast<size_t>(owner * world_ + source); };
    static thread_local std::ostringstream why;  // built once: most steps write nothing to it
    why.str("");
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
        if (counting_ && st.op == Op::FlagCombine) {  // a counter: one more call, seen or not
          ++f.published;
          break;
        }
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
      case Op::WriteView: {  // r's experts write the rows of source st.peer into r's own region
        Slot& slot = s.view_rows[at(r, st.peer)];
        if (!slot.consumed)
          why << "rank " << r << " overwrites its combine_input rows of round " << slot.round << " (round " << st.round
              << ") before rank " << st.peer << " pulled them";
        // Pending only if the source has rows here and pulls them.
        slot = Slot{st.round, !(rows_(st.round, st.peer, r) && pulled_from(world_, st.round, r, views_, protocol_))};
        break;
      }
      case Op::PullView: {  // r reads its rows from st.peer's region over NVLink
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

  static bool no_views(int, int) { return false; }

  int world_;
  Routing rows_;
  Views views_;
  Protocol protocol_;
  bool counting_;
  std::vector<std::vector<Step>> programs_;
  size_t states_ = 0;
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

// Every assignment of the view bit to (rank, round).
std::vector<Views> all_views(int world, int rounds) {
  std::vector<Views> out;
  for (long mask = 0; mask < (1L << (world * rounds)); ++mask) {
    out.push_back([=](int n, int r) { return ((mask >> ((n - 1) * world + r)) & 1) != 0; });
  }
  return out;
}

bool everyone(int, int, int) { return true; }
bool all_views_passed(int, int) { return true; }

// The first violation the checker finds for protocol v over every routing and
// every assignment of view bits (world ranks, `rounds` rounds), or "".
std::string first_violation(int world, int rounds, Protocol v) {
  for (const Routing& routing : all_routings(world, rounds)) {
    for (const Views& views : all_views(world, rounds)) {
      const std::string found = Checker(world, rounds, routing, views, v).run();
      if (!found.empty()) return found;
    }
  }
  return "";
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

TEST_CASE("zero-copy pull combine is safe (2 ranks, 3 rounds, all routings and view bits)", "[protocol][zero-copy]") {
  const std::vector<Routing> routings = all_routings(2, 3);
  size_t runs = 0;
  for (size_t i = 0; i < routings.size(); ++i) {
    for (const Views& views : all_views(2, 3)) {
      Checker c(2, 3, routings[i], views, Protocol::Pull);
      REQUIRE(c.run() == "");
      REQUIRE(c.finished() == 1);  // the one end state: every rank ran every round
      ++runs;
      if (i % 4 != 0) continue;  // the all-or-nothing fallback: every 4th routing, to stay fast
      Checker fallback(2, 3, routings[i], views, Protocol::PullAllOrNothing);
      REQUIRE(fallback.run() == "");
      REQUIRE(fallback.finished() == 1);
    }
  }
  CHECK(runs == 64 * 64);
}

TEST_CASE("zero-copy pull combine is safe (3 ranks, 3 rounds)", "[protocol][zero-copy]") {
  const std::vector<Routing> routings = all_routings(3, 2);
  const std::vector<Views> views = all_views(3, 3);
  // 4096 two-round routings (the third round: everyone sends to everyone) x
  // 512 view assignments; strides through both (about 60 pairs) cover mixed
  // calls of many shapes while keeping the test within a few seconds.
  for (size_t i = 0; i < routings.size(); i += 409) {
    const Routing three_rounds = [&, i](int n, int s, int d) { return n == 3 || routings[i](n, s, d); };
    for (size_t j = i % 5; j < views.size(); j += 89) {
      Checker c(3, 3, three_rounds, views[j], Protocol::Pull);
      INFO("routing " << i << " views " << j);
      REQUIRE(c.run() == "");
      REQUIRE(c.finished() == 1);
    }
  }
  Checker all_pull(3, 3, everyone, all_views_passed, Protocol::Pull);
  REQUIRE(all_pull.run() == "");
  REQUIRE(all_pull.finished() == 1);
  // The fallback where one missing bit sends every rank down the push path.
  for (size_t j : {146, 447, 511}) {
    Checker c(3, 3, everyone, views[j], Protocol::PullAllOrNothing);
    INFO("all or nothing, views " << j);
    REQUIRE(c.run() == "");
    REQUIRE(c.finished() == 1);
  }
}

TEST_CASE("zero-copy pull combine: every weakened variant is caught", "[protocol][zero-copy]") {
  struct Case {
    Protocol variant;
    const char* name;
    const char* expect;
  };
  const Case cases[] = {
      {Protocol::PullBeforeStarted, "pull before started", "pulls combine_input rows of round 0"},
      {Protocol::PullViewBeforeDispatch, "view before dispatch", "overwrites its combine_input rows"},
      {Protocol::PullIgnoringBit, "bit ignored", "pulls combine_input rows of round 0"},
      {Protocol::PullWithoutAdvancing, "counters not advanced", "deadlock"},
      {Protocol::PullStartedOnlyFromPulled, "started only from pulled peers", "overwrites dispatch rows"},
  };
  for (const Case& c : cases) {
    const std::string v = first_violation(2, 2, c.variant);
    INFO(c.name << ":\n" << v);
    REQUIRE(!v.empty());
    CHECK(v.find(c.expect) != std::string::npos);
  }
}
