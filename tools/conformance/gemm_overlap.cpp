#include "gemm_overlap.hpp"

#include <algorithm>
#include <cmath>

#include "counter_rng.hpp"
#include "errors.hpp"

namespace moe_ep_tool {

namespace {

// The marks of one iteration, in the order they are taken (phase i runs from
// mark i to mark i + 1; S = the session stream, C = the all-to-all's, G = the GEMM's):
//   0 S start        1 G gemm start      2 G gemm end
//   3 C dispatch     4 C combine         5 C pair end        (alone, one after the other)
//   6 C dispatch     7 C combine         8 C pair end        (beside each other, from mark 6 ...
//   9 G gemm start  10 G gemm end       11 S both done        ... to mark 11: the wall)
enum Phase : int {
  kGemmAlone = 1,
  kDispatchAlone = 3,
  kCombineAlone = 4,
  kDispatchBeside = 6,
  kCombineBeside = 7,
  kGemmBeside = 9,
  kWallFirst = 6,
  kPhases = 11,
};

constexpr int kAutoNK = 8192;
constexpr int kProbeRows = 4096;     // the GEMM timed to size the real one
constexpr int kRowsMultiple = 256;   // the chosen M is a multiple of this ...
constexpr int kMaxAutoRows = 65536;  // ... at most this

std::vector<double> sum_range(const LoopResult& t, int first, int last) {  // phases [first, last]
  std::vector<double> out = t.phase_us[first];
  for (int p = first + 1; p <= last; ++p) out = sum_each(out, t.phase_us[p]);
  return out;
}

}  // namespace

int gemm_sm_target(const Session& s) {
  const int num_sms = s.options().num_sms;
  return num_sms > 0 ? std::max(1, s.gpu().sms - num_sms) : 0;
}

std::string overlap_refusal(const Session& s, const std::string& flag) {
  if (!s.on_gpu()) return flag + " needs a GPU backend (this run: " + s.backend_name() + ")";
  return BlasGemm::unavailable_reason();
}

GemmOverlap::GemmOverlap(const Session& s, const std::vector<int>& mnk) : s_(s), streams_(s) {
  if (!mnk.empty() && mnk.size() != 3) fail("--gemm-mnk takes three numbers M,N,K, got " + std::to_string(mnk.size()));
  if (mnk.size() == 3) fixed_ = GemmShape{mnk[0], mnk[1], mnk[2]};
  sm_target_ = gemm_sm_target(s);
}

// The same M on every rank: from the slowest rank's times.
GemmShape GemmOverlap::shape_for(MoeEpRunner& runner, bool graph, const LoopOptions& loop) {
  if (!auto_shape()) return fixed_;
  LoopOptions probe = loop;
  probe.warmup = 2;
  probe.iters = 5;
  const World& world = s_.world();
  const LoopResult pair = runner.time(probe, graph);
  const double pair_us = stats_of(world.max_each(sum_each(pair.phase_us[0], pair.phase_us[1]))).avg;
  BlasGemm gemm({kProbeRows, kAutoNK, kAutoNK}, sm_target_, derive(s_.options().seed, 0x6e33));
  const auto stream = static_cast<cudaStream_t>(s_.stream());
  const LoopResult g = time_loop(s_, probe, 1, [&](Marks& m) {
    m.mark();
    gemm.run(stream);
    m.mark();
  });
  const double gemm_us = stats_of(world.max_each(g.phase_us[0])).avg;
  const double rows = gemm_us > 0 ? kProbeRows * pair_us / gemm_us : kProbeRows;
  const int m =
      int(std::clamp(std::ceil(rows / kRowsMultiple) * kRowsMultiple, double(kRowsMultiple), double(kMaxAutoRows)));
  return GemmShape{m, kAutoNK, kAutoNK};
}

OverlapResult GemmOverlap::measure(MoeEpRunner& runner, bool graph, bool check, const LoopOptions& loop) {
  const World& world = s_.world();
  OverlapResult r;
  r.tokens = runner.spec().tokens_per_rank();
  if (check) {
    const auto [d, c] = runner.check(graph);
    r.wrong_dispatch = world.sum(d);
    r.wrong_combine = world.sum(c);
  }
  runner.prepare(graph);
  r.gemm = shape_for(runner, graph, loop);
  r.gemm_sm_target = sm_target_;
  r.gemm_auto_shape = auto_shape();
  BlasGemm gemm(r.gemm, sm_target_, derive(s_.options().seed, uint64_t(r.tokens)));
  void* const S = s_.stream();
  void* const comm = streams_.comm();
  void* const gemm_stream = streams_.compute();
  const auto G = static_cast<cudaStream_t>(gemm_stream);
  const LoopResult t = time_loop(s_, loop, kPhases, [&](Marks& m) {
    m.mark();  // 0
    streams_.follow(gemm_stream, S);
    m.mark_on(gemm_stream);  // 1
    gemm.run(G);
    m.mark_on(gemm_stream);  // 2
    streams_.follow(comm, gemm_stream);
    m.mark_on(comm);  // 3
    runner.launch_dispatch(graph, comm);
    m.mark_on(comm);  // 4
    runner.launch_combine(graph, comm);
    m.mark_on(comm);                     // 5
    streams_.follow(gemm_stream, comm);  // both start here
    m.mark_on(comm);                     // 6
    runner.launch_dispatch(graph, comm);
    m.mark_on(comm);  // 7
    runner.launch_combine(graph, comm);
    m.mark_on(comm);         // 8
    m.mark_on(gemm_stream);  // 9
    gemm.run(G);
    m.mark_on(gemm_stream);  // 10
    streams_.follow(S, gemm_stream);
    streams_.follow(S, comm);
    m.mark();  // 11
  });
  runner.drop_graphs();
  r.gemm_alone = reduce_phase(world, t.phase_us[kGemmAlone]);
  r.dispatch_alone = reduce_phase(world, t.phase_us[kDispatchAlone]);
  r.combine_alone = reduce_phase(world, t.phase_us[kCombineAlone]);
  r.pair_alone = reduce_phase(world, sum_range(t, kDispatchAlone, kCombineAlone));
  r.gemm_beside = reduce_phase(world, t.phase_us[kGemmBeside]);
  r.dispatch_beside = reduce_phase(world, t.phase_us[kDispatchBeside]);
  r.combine_beside = reduce_phase(world, t.phase_us[kCombineBeside]);
  r.pair_beside = reduce_phase(world, sum_range(t, kDispatchBeside, kCombineBeside));
  r.wall = reduce_phase(world, sum_range(t, kWallFirst, kPhases - 1));
  r.gate_expired = t.gate_expired;
  return r;
}

}  // namespace moe_ep_tool
