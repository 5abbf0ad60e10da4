// Groups "flag", "row" and "ll": one block on each side, running at the same
// time, pass a round number back and forth.  Side A stores round r into side
// B's memory and waits for B's answer r in its own memory; B waits for r, then
// answers.  A times every round trip with clock64 (converted with the ratio
// of global-timer ns to cycles over the whole kernel); one way = RTT / 2.
// What travels with the round number differs per protocol: nothing (a flag),
// a 14336-byte row then a system fence then the flag, or the row with the
// round number carried in every 16-byte word (flags in the data).
#include <string>
#include <vector>

#include "cuda_support.cuh"
#include "probe_row.cuh"

namespace moe_ep_probe {

namespace {

constexpr unsigned kTaggedWords = kRowBytes / 8;  // 1792 16-byte words, 8 payload bytes each

// Per side, in that side's memory: the flag the peer stores into, the result,
// the row the peer stores into.
constexpr size_t kFlagOffset = 0;
constexpr size_t kResultOffset = 256;
constexpr size_t kRowOffset = 1024;
constexpr size_t kRegionBytes = kRowOffset + size_t(kTaggedWords) * 16;

enum Status : int { kDone = 0, kTimedOut = 1 };

struct SideResult {
  int status;
  unsigned failed_round;
  unsigned long long payload_errors;
  unsigned long long ns_begin, ns_end;  // around the timed rounds (side A)
  long long cycles_begin, cycles_end;
};

struct PingPongArgs {
  unsigned* my_flag;    // this side's memory: the peer stores the round here
  unsigned* peer_flag;  // the peer's memory
  uint4* my_row;        // the row (row protocols); the same bytes as tagged words (flags in the data)
  uint4* peer_row;
  ulonglong2* my_words;
  ulonglong2* peer_words;
  long long* round_trip_cycles;  // side A: one per timed round
  long long* fence_cycles;       // side A: one per timed round (0 where the protocol has no fence)
  SideResult* result;
  unsigned warmup_rounds;
  unsigned timed_rounds;
  unsigned long long timeout_ns;
  int initiator;
};

__device__ __forceinline__ bool wait_for_round(const unsigned* flag, unsigned round, unsigned long long timeout_ns) {
  return spin_until([&] { return load_acquire_sys(flag) == round; }, timeout_ns);
}

// How the round number is published: a store, or (as the library's arrival
// counters) an add of 1 to a counter that then holds the round.
enum class FlagStore { relaxed, release, fence_then_relaxed, add_relaxed };

// fence.acq_rel.sys, and how many cycles it took.
__device__ __forceinline__ long long timed_fence_sys() {
  const long long t0 = cycles_now();
  fence_acq_rel_sys();
  return cycles_now() - t0;
}

// Only the round number travels: one thread each side.
template <FlagStore kStore>
struct FlagOnly {
  static constexpr unsigned kThreads = 1;
  __device__ static long long send(const PingPongArgs& a, unsigned round) {
    long long fence = 0;
    if (kStore == FlagStore::release) {
      store_release_sys(a.peer_flag, round);
    } else if (kStore == FlagStore::relaxed) {
      store_relaxed_sys(a.peer_flag, round);
    } else if (kStore == FlagStore::add_relaxed) {
      add_relaxed_sys(a.peer_flag, 1);
    } else {
      fence = timed_fence_sys();
      store_relaxed_sys(a.peer_flag, round);
    }
    return fence;
  }
  __device__ static bool receive(const PingPongArgs& a, unsigned round) {
    return wait_for_round(a.my_flag, round, a.timeout_ns);
  }
};

// The row in 16-byte stores by the whole block, a barrier, then thread 0:
// fence.acq_rel.sys (timed) and the relaxed flag.  kFence = false drops the
// fence: not a correct protocol (the flag may overtake the row), it shows
// what the fence adds to the chain.
template <bool kFence>
struct RowThenFlag {
  static constexpr unsigned kThreads = kRowThreads;
  __device__ static long long send(const PingPongArgs& a, unsigned round) {
    store_row(a.peer_row, round);
    __syncthreads();
    long long fence = 0;
    if (threadIdx.x == 0) {
      if (kFence) fence = timed_fence_sys();
      store_relaxed_sys(a.peer_flag, round);
    }
    return fence;
  }
  __device__ static bool receive(const PingPongArgs& a, unsigned round) {
    return threadIdx.x != 0 || wait_for_round(a.my_flag, round, a.timeout_ns);
  }
};

// Flags in the data: each 16-byte word is two 8-byte elements {payload (low
// 32 bits), round (high 32 bits)}.  An aligned 8-byte element is read whole,
// so each half proves its own payload current; the 16 bytes as a pair carry
// no such guarantee, hence a round in each half.  The receiver's threads poll
// their own words until both halves show the round.  No fence, no separate
// flag; twice the bytes.
struct FlagsInData {
  static constexpr unsigned kThreads = kRowThreads;
  __device__ static unsigned long long half(unsigned round, unsigned word, unsigned which) {
    const unsigned payload = (round * 2654435761u) ^ (word * 2u + which);
    return (static_cast<unsigned long long>(round) << 32) | payload;
  }
  __device__ static long long send(const PingPongArgs& a, unsigned round) {
    for (unsigned w = threadIdx.x; w < kTaggedWords; w += blockDim.x) {
      store_relaxed_sys_v2(a.peer_words + w, make_ulonglong2(half(round, w, 0), half(round, w, 1)));
    }
    return 0;
  }
  __device__ static bool receive(const PingPongArgs& a, unsigned round) {
    for (unsigned w = threadIdx.x; w < kTaggedWords; w += blockDim.x) {
      ulonglong2 word;
      const bool arrived = spin_until(
          [&] {
            word = load_relaxed_sys_v2(a.my_words + w);
            return (word.x >> 32) == round && (word.y >> 32) == round;
          },
          a.timeout_ns);
      if (!arrived) return false;
      if (word.x != half(round, w, 0) || word.y != half(round, w, 1)) atomicAdd(&a.result->payload_errors, 1ull);
    }
    return true;
  }
};

template <class Protocol>
__global__ void __launch_bounds__(kRowThreads) ping_pong_kernel(PingPongArgs a) {
  const unsigned rounds = a.warmup_rounds + a.timed_rounds;
  const bool timer = a.initiator && threadIdx.x == 0;
  int status = kDone;
  unsigned failed_round = 0;
  for (unsigned round = 1; round <= rounds; ++round) {
    if (timer && round == a.warmup_rounds + 1) {
      a.result->ns_begin = global_ns();
      a.result->cycles_begin = cycles_now();
    }
    const long long start = cycles_now();
    long long fence = 0;
    if (a.initiator) fence = Protocol::send(a, round);
    const bool arrived = Protocol::receive(a, round);
    // Every thread leaves together (a barrier all reach) when any wait timed out.
    if (__syncthreads_or(!arrived)) {
      status = kTimedOut;
      failed_round = round;
      break;
    }
    if (!a.initiator) Protocol::send(a, round);
    if (timer && round > a.warmup_rounds) {
      const unsigned k = round - a.warmup_rounds - 1;
      a.round_trip_cycles[k] = cycles_now() - start;
      a.fence_cycles[k] = fence;
    }
  }
  if (threadIdx.x == 0) {
    a.result->ns_end = global_ns();
    a.result->cycles_end = cycles_now();
    a.result->status = status;
    a.result->failed_round = failed_round;
  }
}

struct PingPongSamples {
  std::vector<double> one_way_us;  // RTT / 2 of every timed round
  std::vector<double> fence_us;    // side A's fence of every timed round
  double mean_one_way_globaltimer_us = 0;
  unsigned long long payload_errors = 0;
  std::string error;  // a wait timed out
};

// Runs `options.kernel_runs` ping-pong kernels and pools their samples.
template <class Protocol>
PingPongSamples run_ping_pong(const Sides& sides, const ProbeOptions& options) {
  const unsigned timed = unsigned(options.round_trips);
  DeviceBuffer region_a(sides.device_a, kRegionBytes), region_b(sides.device_b, kRegionBytes);
  DeviceBuffer samples(sides.device_a, 2 * sizeof(long long) * timed);
  Stream stream_a(sides.device_a), stream_b(sides.device_b);

  PingPongArgs args_a = {};
  args_a.my_flag = region_a.at<unsigned>(kFlagOffset);
  args_a.peer_flag = region_b.at<unsigned>(kFlagOffset);
  args_a.my_row = region_a.at<uint4>(kRowOffset);
  args_a.peer_row = region_b.at<uint4>(kRowOffset);
  args_a.my_words = region_a.at<ulonglong2>(kRowOffset);
  args_a.peer_words = region_b.at<ulonglong2>(kRowOffset);
  args_a.round_trip_cycles = samples.as<long long>();
  args_a.fence_cycles = samples.as<long long>() + timed;
  args_a.result = region_a.at<SideResult>(kResultOffset);
  args_a.warmup_rounds = unsigned(options.warmup_trips);
  args_a.timed_rounds = timed;
  args_a.timeout_ns = 1000000ull * unsigned(options.timeout_ms);
  args_a.initiator = 1;
  PingPongArgs args_b = args_a;
  std::swap(args_b.my_flag, args_b.peer_flag);
  std::swap(args_b.my_row, args_b.peer_row);
  std::swap(args_b.my_words, args_b.peer_words);
  args_b.round_trip_cycles = nullptr;
  args_b.fence_cycles = nullptr;
  args_b.result = region_b.at<SideResult>(kResultOffset);
  args_b.initiator = 0;

  PingPongSamples out;
  std::vector<long long> host_samples(2 * size_t(timed));
  for (int run = 0; run < options.kernel_runs; ++run) {
    // Both regions start at round 0 before either kernel starts.
    for (const DeviceBuffer* region : {&region_a, &region_b}) {
      DeviceScope scope(region->device());
      PROBE_CUDA(cudaMemset(region->as<void>(), 0, region->bytes()));
      PROBE_CUDA(cudaDeviceSynchronize());
    }
    {
      DeviceScope scope(sides.device_b);
      launch(ping_pong_kernel<Protocol>, 1, Protocol::kThreads, stream_b.get(), false, args_b);
    }
    {
      DeviceScope scope(sides.device_a);
      launch(ping_pong_kernel<Protocol>, 1, Protocol::kThreads, stream_a.get(), false, args_a);
    }
    stream_a.synchronize();
    stream_b.synchronize();
    SideResult result_a = {}, result_b = {};
    PROBE_CUDA(cudaMemcpy(&result_a, args_a.result, sizeof result_a, cudaMemcpyDeviceToHost));
    PROBE_CUDA(cudaMemcpy(&result_b, args_b.result, sizeof result_b, cudaMemcpyDeviceToHost));
    out.payload_errors += result_a.payload_errors + result_b.payload_errors;
    if (result_a.status != kDone || result_b.status != kDone) {
      const bool a_failed = result_a.status != kDone;
      out.error = std::string("timeout: side ") + (a_failed ? "A" : "B") + " waited more than " +
                  std::to_string(options.timeout_ms) + " ms for round " +
                  std::to_string(a_failed ? result_a.failed_round : result_b.failed_round) + " (kernel run " +
                  std::to_string(run + 1) + ")";
      return out;
    }
    PROBE_CUDA(cudaMemcpy(host_samples.data(), samples.as<long long>(), samples.bytes(), cudaMemcpyDeviceToHost));
    const long long cycles = result_a.cycles_end - result_a.cycles_begin;
    const double ns = double(result_a.ns_end - result_a.ns_begin);
    if (cycles <= 0 || ns <= 0) {
      out.error = "side A's clocks did not advance over the timed rounds";
      return out;
    }
    const double ns_per_cycle = ns / double(cycles);
    for (unsigned k = 0; k < timed; ++k) {
      out.one_way_us.push_back(cycles_to_us(host_samples[k], ns_per_cycle) / 2);
      out.fence_us.push_back(cycles_to_us(host_samples[timed + k], ns_per_cycle));
    }
    out.mean_one_way_globaltimer_us += ns / timed / 2 / 1000 / options.kernel_runs;
  }
  if (out.payload_errors != 0) {
    out.error = std::to_string(out.payload_errors) + " words held the expected round but the wrong payload";
  }
  return out;
}

template <class Protocol>
Measurement one_way(const Sides& sides, const ProbeOptions& options, const char* name, const char* what,
                    PingPongSamples* keep = nullptr) {
  PingPongSamples s = run_ping_pong<Protocol>(sides, options);
  Measurement m{name, what, s.one_way_us, s.error, {}};
  if (m.error.empty()) m.extras.emplace_back("mean_one_way_globaltimer_us", s.mean_one_way_globaltimer_us);
  if (keep != nullptr) *keep = std::move(s);
  return m;
}

Measurement fence_alone(const PingPongSamples& s, const char* name, const char* what) {
  return {name, what, s.error.empty() ? s.fence_us : std::vector<double>{}, s.error, {}};
}

}  // namespace

std::vector<Measurement> measure_flag_one_way(const Sides& sides, const ProbeOptions& options) {
  std::vector<Measurement> out;
  out.push_back(one_way<FlagOnly<FlagStore::relaxed>>(
      sides, options, "flag_one_way_relaxed",
      "1 thread each side: st.relaxed.sys into the peer, the peer polls ld.acquire.sys; RTT / 2"));
  out.push_back(one_way<FlagOnly<FlagStore::release>>(sides, options, "flag_one_way_release",
                                                      "as flag_one_way_relaxed with st.release.sys; RTT / 2"));
  out.push_back(one_way<FlagOnly<FlagStore::add_relaxed>>(
      sides, options, "flag_one_way_add",
      "as flag_one_way_relaxed, published as red.relaxed.sys.add of 1 (as the library's arrival counters); RTT / 2"));
  PingPongSamples fenced;
  out.push_back(one_way<FlagOnly<FlagStore::fence_then_relaxed>>(
      sides, options, "flag_one_way_fence_relaxed",
      "as flag_one_way_relaxed with fence.acq_rel.sys before the store (no data outstanding); RTT / 2", &fenced));
  out.push_back(fence_alone(fenced, "fence_sys_nothing_outstanding",
                            "fence.acq_rel.sys alone (clock64 around it, side A) with no remote store outstanding"));
  return out;
}

std::vector<Measurement> measure_row_fence_flag(const Sides& sides, const ProbeOptions& options) {
  std::vector<Measurement> out;
  PingPongSamples fenced;
  out.push_back(one_way<RowThenFlag<true>>(
      sides, options, "row_fence_flag_one_way",
      "512 threads store a 14336-byte row into the peer (16-byte stores), barrier, fence.acq_rel.sys, relaxed "
      "flag; the peer polls; RTT / 2",
      &fenced));
  out.push_back(fence_alone(fenced, "fence_sys_after_row",
                            "the fence.acq_rel.sys of row_fence_flag_one_way alone (clock64 around it, side A)"));
  out.push_back(one_way<RowThenFlag<false>>(
      sides, options, "row_flag_no_fence_one_way",
      "as row_fence_flag_one_way without the fence (not a correct protocol: shows what the fence adds); RTT / 2"));
  return out;
}

std::vector<Measurement> measure_flags_in_data(const Sides& sides, const ProbeOptions& options) {
  return {one_way<FlagsInData>(
      sides, options, "ll_row_one_way",
      "the 14336-byte row as 1792 16-byte words, each two 8-byte {4 payload bytes, round} (28672 bytes), no "
      "fence, no flag; every receiving thread polls its words, barrier, answer; RTT / 2")};
}

}  // namespace moe_ep_probe
