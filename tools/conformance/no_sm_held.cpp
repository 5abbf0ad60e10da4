#include "no_sm_held.hpp"

#include <chrono>
#include <thread>

#include "counter_rng.hpp"
#include "errors.hpp"

namespace moe_ep_tool {

namespace {

// The marks of one iteration (S = the session stream, C = communication, G = compute):
//   0 S start   1 G gemm start   2 G gemm end          (alone)
//   3 G gemm start   4 G gemm end                       (between dispatch_send and dispatch_recv)
//   5 G gemm start   6 G gemm end   7 S all done        (between combine_send and combine_recv)
enum Phase : int { kGemmAlone = 1, kGemmInDispatch = 3, kGemmInCombine = 5, kPhases = 7 };

void CUDART_CB sleep_for(void* us) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(*static_cast<const double*>(us)));
}

}  // namespace

NoSmHeld::NoSmHeld(const Session& s, const std::vector<int>& mnk)
    : s_(s), shape_{kNoSmHeldGemmDim, kNoSmHeldGemmDim, kNoSmHeldGemmDim}, streams_(s) {
  if (!mnk.empty() && mnk.size() != 3) fail("--gemm-mnk takes three numbers M,N,K, got " + std::to_string(mnk.size()));
  if (mnk.size() == 3) shape_ = GemmShape{mnk[0], mnk[1], mnk[2]};
}

NoSmHeldResult NoSmHeld::measure(MoeEpRunner& runner, bool graph, bool check, const LoopOptions& loop) {
  const World& world = s_.world();
  NoSmHeldResult r;
  r.tokens = runner.spec().tokens_per_rank();
  r.gemm = shape_;
  if (check) {
    const auto [d, c] = runner.check_split(graph);
    r.wrong_dispatch = world.sum(d);
    r.wrong_combine = world.sum(c);
  }
  runner.prepare(graph, true);
  BlasGemm gemm(shape_, 0, derive(s_.options().seed, 0x5e1d));
  void* const S = s_.stream();
  void* const C = streams_.comm();
  void* const G = streams_.compute();
  const auto gemm_stream = static_cast<cudaStream_t>(G);
  // The delay: the GEMM alone, slowest rank.
  LoopOptions probe = loop;
  probe.warmup = 2;
  probe.iters = 5;
  auto alone = [&](Marks& m) {  // the GEMM, after what S holds; its marks on G
    streams_.follow(G, S);
    m.mark_on(G);
    gemm.run(gemm_stream);
    m.mark_on(G);
    streams_.follow(S, G);
  };
  delay_us_ = stats_of(world.max_each(time_loop(s_, probe, 1, alone).phase_us[0])).p50;
  r.delay_us = delay_us_;
  const bool late = world.rank != 0;
  // One bracket: the send half, the GEMM once it is done, the receive half
  // right behind the send half on its stream.
  auto bracket = [&](Marks& m, MoeEpRunner::Half send) {
    streams_.follow(C, S);
    if (late) TOOL_CHECK_CUDA(cudaLaunchHostFunc(static_cast<cudaStream_t>(C), sleep_for, &delay_us_));
    runner.launch_half(send, graph, C);
    streams_.follow(G, C);
    m.mark_on(G);
    gemm.run(gemm_stream);
    m.mark_on(G);
    runner.launch_half(MoeEpRunner::Half(send + 1), graph, C);  // on C: it does not wait for the GEMM
    streams_.follow(S, C);
    streams_.follow(S, G);
  };
  const LoopResult t = time_loop(s_, loop, kPhases, [&](Marks& m) {
    m.mark();                                // 0
    alone(m);                                // 1, 2
    bracket(m, MoeEpRunner::kDispatchSend);  // 3, 4
    bracket(m, MoeEpRunner::kCombineSend);   // 5, 6
    m.mark();                                // 7
  });
  runner.drop_graphs();
  reduce_phases(
      world, t,
      {{kGemmAlone, &r.gemm_alone}, {kGemmInDispatch, &r.gemm_in_dispatch}, {kGemmInCombine, &r.gemm_in_combine}},
      &r.gate_expired);
  return r;
}

}  // namespace moe_ep_tool
