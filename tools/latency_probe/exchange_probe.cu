// Group "call" (its exchange half): the smallest two-sided exchange of a
// dispatch or combine, run as a call and timed as the moe_ep benchmark times
// one.  On each side one block of 512 threads stores a 14336-byte row into
// the peer, barrier, thread 0: fence.acq_rel.sys, a relaxed add of 1 on a
// counter in the peer's memory, then waits until its own counter (the peer's
// adds) reaches the round, and the kernel ends.  The round advances by itself
// from replay to replay: each side keeps the rounds it completed in its own
// memory, and every kernel reads and bumps that word, so one captured graph
// serves every call.  The same exchange repeated inside one kernel gives the
// protocol's own cost per round, without launches.
#include <memory>
#include <string>
#include <vector>

#include "cuda_support.cuh"
#include "evented_loop.cuh"
#include "probe_row.cuh"

namespace moe_ep_probe {

namespace {

// Per side, in that side's memory.
constexpr size_t kCounterOffset = 0;   // the peer adds 1 per round
constexpr size_t kRoundOffset = 128;   // rounds this side completed: written only by its own kernels
constexpr size_t kStatusOffset = 256;  // ExchangeStatus
constexpr size_t kClockOffset = 512;   // LoopClock (side A, in-kernel loop)
constexpr size_t kRowOffset = 1024;    // the row the peer stores
constexpr size_t kRegionBytes = kRowOffset + kRowBytes;

struct ExchangeStatus {
  unsigned failed_round;  // 0, or the round whose wait timed out on this side
  unsigned peer_failed;   // set by the peer when a wait of its own timed out
};

struct LoopClock {
  unsigned long long ns_begin, ns_end;  // around the timed rounds
  long long cycles_begin, cycles_end;
};

struct ExchangeArgs {
  uint4* peer_row;
  unsigned* peer_counter;
  const unsigned* my_counter;
  unsigned* my_round;
  ExchangeStatus* my_status;
  ExchangeStatus* peer_status;
  unsigned long long timeout_ns;
};

// One round, on every thread of the block.  The peer may be a round ahead
// (it finishes round r once our add r arrives, then adds r + 1), and the
// counter only grows: hence "at least the round".  Returns, on every thread,
// whether the wait ended in time (a barrier all reach).
__device__ bool exchange_round(const ExchangeArgs& a, unsigned round) {
  store_row(a.peer_row, round);
  __syncthreads();
  bool arrived = true;
  if (threadIdx.x == 0) {
    fence_acq_rel_sys();  // the row before the count
    add_relaxed_sys(a.peer_counter, 1);
    arrived = spin_until([&] { return static_cast<int>(load_acquire_sys(a.my_counter) - round) >= 0; }, a.timeout_ns);
  }
  return !__syncthreads_or(!arrived);
}

// Thread 0, after a wait timed out: this side stops, and tells the peer to.
__device__ void record_timeout(const ExchangeArgs& a, unsigned round) {
  a.my_status->failed_round = round;
  store_relaxed_sys(&a.peer_status->peer_failed, 1);
}

// One call: one round.  Once either side has timed out, the calls still
// queued return at once (a failure costs one timeout, not one per call).
__global__ void __launch_bounds__(kRowThreads) exchange_call_kernel(ExchangeArgs a) {
  __shared__ unsigned round;  // 0: stopped
  if (threadIdx.x == 0) {
    // Plain loads, issued together: the words are this side's own (the peer's
    // flag only stops later calls sooner).
    const volatile ExchangeStatus* status = a.my_status;
    const bool stopped = status->failed_round != 0 || status->peer_failed != 0;
    round = stopped ? 0 : *a.my_round + 1;
  }
  __syncthreads();
  if (round == 0) return;
  const bool arrived = exchange_round(a, round);
  if (threadIdx.x == 0) {
    if (arrived) {
      *a.my_round = round;
    } else {
      record_timeout(a, round);
    }
  }
}

// The exchange repeated `warmup + timed` times in one kernel (rounds from 1);
// with `round_cycles`, thread 0 times every timed round with clock64.
__global__ void __launch_bounds__(kRowThreads)
    exchange_loop_kernel(ExchangeArgs a, unsigned warmup, unsigned timed, long long* round_cycles, LoopClock* clock) {
  const bool timer = threadIdx.x == 0 && round_cycles != nullptr;
  for (unsigned round = 1; round <= warmup + timed; ++round) {
    if (timer && round == warmup + 1) {
      clock->ns_begin = global_ns();
      clock->cycles_begin = cycles_now();
    }
    const long long start = cycles_now();
    if (!exchange_round(a, round)) {
      if (threadIdx.x == 0) record_timeout(a, round);
      return;
    }
    if (timer && round > warmup) round_cycles[round - warmup - 1] = cycles_now() - start;
  }
  if (threadIdx.x == 0) *a.my_round = warmup + timed;
  if (timer) {
    clock->ns_end = global_ns();
    clock->cycles_end = cycles_now();
  }
}

// Both sides of the exchange: each one's memory, stream and kernel arguments.
class Exchange {
 public:
  Exchange(const Sides& sides, const ProbeOptions& options) : timeout_ms_(options.timeout_ms) {
    const int devices[2] = {sides.device_a, sides.device_b};
    for (int s = 0; s < 2; ++s) {
      region_[s] = std::make_unique<DeviceBuffer>(devices[s], kRegionBytes);
      stream_[s] = std::make_unique<Stream>(devices[s]);
    }
    for (int s = 0; s < 2; ++s) {
      const DeviceBuffer& mine = *region_[s];
      const DeviceBuffer& peer = *region_[1 - s];
      args_[s].peer_row = peer.at<uint4>(kRowOffset);
      args_[s].peer_counter = peer.at<unsigned>(kCounterOffset);
      args_[s].my_counter = mine.at<unsigned>(kCounterOffset);
      args_[s].my_round = mine.at<unsigned>(kRoundOffset);
      args_[s].my_status = mine.at<ExchangeStatus>(kStatusOffset);
      args_[s].peer_status = peer.at<ExchangeStatus>(kStatusOffset);
      args_[s].timeout_ns = 1000000ull * unsigned(options.timeout_ms);
    }
  }

  const ExchangeArgs& args(int side) const { return args_[side]; }
  const Stream& stream(int side) const { return *stream_[side]; }
  LoopClock* clock() const { return region_[0]->at<LoopClock>(kClockOffset); }

  // Counters, rounds, statuses and rows to 0 on both sides (nothing running).
  void reset() const {
    for (const auto& region : region_) {
      DeviceScope scope(region->device());
      PROBE_CUDA(cudaMemset(region->as<void>(), 0, region->bytes()));
      PROBE_CUDA(cudaDeviceSynchronize());
    }
  }

  // Empty, or which side timed out waiting for which round.
  std::string timeouts() const {
    for (int s = 0; s < 2; ++s) {
      ExchangeStatus status = {};
      PROBE_CUDA(cudaMemcpy(&status, args_[s].my_status, sizeof status, cudaMemcpyDeviceToHost));
      if (status.failed_round != 0) {
        return std::string("timeout: side ") + side_name(s) + " waited more than " + std::to_string(timeout_ms_) +
               " ms for the peer's add of round " + std::to_string(status.failed_round);
      }
    }
    return "";
  }

  // Empty when both sides completed `rounds` rounds and each holds the row
  // the peer sent in the last one; else what differs.
  std::string check_last_round(long long rounds) const {
    std::vector<uint4> row(kRowVectors);
    for (int s = 0; s < 2; ++s) {
      unsigned done = 0;
      PROBE_CUDA(cudaMemcpy(&done, args_[s].my_round, sizeof done, cudaMemcpyDeviceToHost));
      if ((long long)done != rounds) {
        return std::string("side ") + side_name(s) + " completed " + std::to_string(done) + " rounds, expected " +
               std::to_string(rounds);
      }
      PROBE_CUDA(cudaMemcpy(row.data(), region_[s]->at<uint4>(kRowOffset), kRowBytes, cudaMemcpyDeviceToHost));
      for (unsigned v = 0; v < kRowVectors; ++v) {
        const uint4 want = row_vector(done, v);
        if (row[v].x != want.x || row[v].y != want.y || row[v].z != want.z || row[v].w != want.w) {
          return std::string("side ") + side_name(s) + "'s row: 16-byte vector " + std::to_string(v) +
                 " is not the peer's last round's (" + std::to_string(done) + ")";
        }
      }
    }
    return "";
  }

 private:
  static char side_name(int side) { return side == 0 ? 'A' : 'B'; }

  int timeout_ms_;
  std::unique_ptr<DeviceBuffer> region_[2];
  std::unique_ptr<Stream> stream_[2];
  ExchangeArgs args_[2] = {};
};

// One line of exchange calls: every side enqueues `phases` (per side) per
// iteration; afterwards both sides must have completed one round per call.
Measurement call_line(const Exchange& exchange, const ProbeOptions& options, const char* name, const char* what,
                      const std::vector<CallSide>& sides) {
  exchange.reset();
  const EventedTimes times = time_evented_calls(sides, evented_plan(options), [&] { return exchange.timeouts(); });
  Measurement m = evented_measurement(name, what, times);
  if (m.error.empty()) {
    m.error = exchange.check_last_round(times.iterations_enqueued * (long long)sides[0].phases.size());
  }
  if (!m.error.empty()) m.samples_us.clear();
  return m;
}

Measurement loop_line(const Sides& sides, const Exchange& exchange, const ProbeOptions& options) {
  Measurement m{"exchange_in_one_kernel_loop",
                "the exchange of exchange_graph_one_way repeated inside one kernel on each side (no launch, no "
                "event): one round, side A's clock64",
                {},
                "",
                {}};
  const unsigned warmup = unsigned(options.warmup_trips);
  const unsigned timed = unsigned(options.round_trips);
  DeviceBuffer cycles(sides.device_a, sizeof(long long) * timed);
  std::vector<long long> host_cycles(timed);
  double mean_us = 0;
  for (int run = 0; run < options.kernel_runs; ++run) {
    exchange.reset();
    for (int s : {1, 0}) {
      DeviceScope scope(exchange.stream(s).device());
      launch(exchange_loop_kernel, 1, kRowThreads, exchange.stream(s).get(), false, exchange.args(s), warmup, timed,
             s == 0 ? cycles.as<long long>() : nullptr, exchange.clock());
    }
    exchange.stream(0).synchronize();
    exchange.stream(1).synchronize();
    m.error = exchange.timeouts();
    if (m.error.empty()) m.error = exchange.check_last_round(warmup + timed);
    if (!m.error.empty()) {
      m.samples_us.clear();
      return m;
    }
    LoopClock clock = {};
    PROBE_CUDA(cudaMemcpy(&clock, exchange.clock(), sizeof clock, cudaMemcpyDeviceToHost));
    PROBE_CUDA(cudaMemcpy(host_cycles.data(), cycles.as<long long>(), cycles.bytes(), cudaMemcpyDeviceToHost));
    const double ns = double(clock.ns_end - clock.ns_begin);
    const long long elapsed_cycles = clock.cycles_end - clock.cycles_begin;
    if (ns <= 0 || elapsed_cycles <= 0) {
      m.error = "side A's clocks did not advance over the timed rounds";
      m.samples_us.clear();
      return m;
    }
    const double ns_per_cycle = ns / double(elapsed_cycles);
    for (long long c : host_cycles) m.samples_us.push_back(cycles_to_us(c, ns_per_cycle));
    mean_us += ns / timed / 1000 / options.kernel_runs;
  }
  m.extras.emplace_back("mean_round_globaltimer_us", mean_us);
  return m;
}

}  // namespace

std::vector<Measurement> measure_exchange_calls(const Sides& sides, const ProbeOptions& options) {
  const Exchange exchange(sides, options);
  // Per side two graphs of the same kernel: the benchmark alternates two (dispatch, combine).
  GraphExec graphs[2][2];
  for (int s = 0; s < 2; ++s) {
    for (GraphExec& graph : graphs[s]) {
      graph = capture_graph(exchange.stream(s).device(), [&](cudaStream_t stream) {
        launch(exchange_call_kernel, 1, kRowThreads, stream, false, exchange.args(s));
      });
    }
  }
  auto replay = [&](int s, int g) {
    return [&exchange, &graphs, s, g]() { PROBE_CUDA(cudaGraphLaunch(graphs[s][g].get(), exchange.stream(s).get())); };
  };
  auto eager = [&](int s) {
    return [&exchange, s]() {
      launch(exchange_call_kernel, 1, kRowThreads, exchange.stream(s).get(), false, exchange.args(s));
    };
  };
  const Stream* a = &exchange.stream(0);
  const Stream* b = &exchange.stream(1);

  std::vector<Measurement> out;
  out.push_back(call_line(exchange, options, "exchange_graph_one_way",
                          "a call of the minimal exchange (row into the peer, barrier, fence.acq_rel.sys, relaxed add "
                          "on the peer's counter, wait for the peer's add), one graph per side, timed as the "
                          "benchmark: event, replay, event on both sides; the slower side per iteration",
                          {{a, {replay(0, 0)}}, {b, {replay(1, 0)}}}));
  out.push_back(call_line(exchange, options, "exchange_eager",
                          "as exchange_graph_one_way, the kernel launched without a graph",
                          {{a, {eager(0)}}, {b, {eager(1)}}}));
  out.push_back(call_line(exchange, options, "exchange_graph_alternating",
                          "as exchange_graph_one_way with two graphs of the exchange per side replayed alternately, "
                          "an event before, between and after (the benchmark's dispatch/combine iteration)",
                          {{a, {replay(0, 0), replay(0, 1)}}, {b, {replay(1, 0), replay(1, 1)}}}));
  out.push_back(loop_line(sides, exchange, options));
  if (sides.same_gpu) {
    for (Measurement& m : out) m.what += " [same GPU: both sides on GPU 0]";
  }
  return out;
}

}  // namespace moe_ep_probe
