// Group "load": the latency of one load that the next load depends on
// (pointer chasing, ld.relaxed.sys: never served from L1), from side A into
// side B's memory and into A's own, each with the ring hot in the owner's L2
// and, after the owner's L2 has been flushed, cold (HBM).  Rings are 128-byte
// lines in a scrambled order, each node holding the word offset of the next.
#include <memory>
#include <string>
#include <vector>

#include "cuda_support.cuh"

namespace moe_ep_probe {

namespace {

constexpr unsigned kWordsPerLine = 16;        // 128-byte lines of 8-byte words
constexpr unsigned kRingLines = 1u << 19;     // 64 MiB of lines to scatter a cold ring over
constexpr unsigned kHotRingNodes = 64;        // 8 KiB: stays in L2
constexpr size_t kFlushBytes = 512ull << 20;  // written before a cold chase: ten times the L2
constexpr unsigned kScrambler = 2654435761u;  // odd: k -> k * kScrambler mod 2^n is a permutation

// Node k sits at line (k * kScrambler) mod `lines` (distinct lines for k < lines)
// and points to node k + 1; the last node points back to node 0 (line 0).
__global__ void build_ring_kernel(unsigned long long* ring, unsigned nodes, unsigned lines) {
  const unsigned k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= nodes) return;
  const unsigned line = (k * kScrambler) & (lines - 1);
  const unsigned next_line = ((k + 1 == nodes ? 0u : k + 1) * kScrambler) & (lines - 1);
  ring[size_t(line) * kWordsPerLine] = size_t(next_line) * kWordsPerLine;
}

// One thread follows the ring for `loads` loads, stamping the cycle counter
// before each.  The stamp before load i+1 is taken as soon as load i has
// issued, and load i issues only once load i-1 has returned, so stamp[i+1] -
// stamp[i] is the latency of load i-1 (plus a few instructions).
__global__ void chase_kernel(const unsigned long long* ring, unsigned loads, long long* stamps,
                             unsigned long long* sink, unsigned long long* ns_and_cycles) {
  const uint64_t ns0 = global_ns();
  const long long c0 = cycles_now();
  unsigned long long next = 0;
  for (unsigned i = 0; i < loads; ++i) {
    stamps[i] = cycles_now();
    next = load_relaxed_sys(ring + next);
  }
  stamps[loads] = cycles_now();
  *sink = next;  // keeps the chain
  ns_and_cycles[0] = global_ns() - ns0;
  ns_and_cycles[1] = static_cast<unsigned long long>(cycles_now() - c0);
}

struct Ring {
  const char* name;
  const char* what;
  bool remote;  // in side B's memory
  bool cold;    // owner's L2 flushed before every chase
};

const Ring kRings[] = {
    {"load_local_l2_hit", "dependent 8-byte ld.relaxed.sys from side A's own memory, hot in L2 (64-line ring)", false,
     false},
    {"load_local_hbm", "the same from side A's own memory after flushing its L2 (each line loaded once: HBM)", false,
     true},
    {"load_remote_l2_hit",
     "dependent 8-byte ld.relaxed.sys from side B's memory, hot in B's L2 (64-line ring): one remote round trip", true,
     false},
    {"load_remote_hbm", "the same from side B's memory after flushing B's L2 (each line loaded once)", true, true},
};

Measurement chase(const Sides& sides, const ProbeOptions& options, const Ring& r) {
  const int owner = r.remote ? sides.device_b : sides.device_a;
  const unsigned loads = unsigned(options.chase_loads);
  // A cold chase visits every node once; a hot one goes round a small ring.
  const unsigned nodes = r.cold ? loads + 1 : kHotRingNodes;
  const unsigned lines = r.cold ? kRingLines : kHotRingNodes;
  DeviceBuffer ring(owner, size_t(lines) * kWordsPerLine * sizeof(unsigned long long));
  DeviceBuffer stamps(sides.device_a, (size_t(loads) + 1) * sizeof(long long));
  DeviceBuffer scratch(sides.device_a, 3 * sizeof(unsigned long long));
  Stream owner_stream(owner), chase_stream(sides.device_a);
  {
    DeviceScope scope(owner);
    launch(build_ring_kernel, (nodes + 255) / 256, 256, owner_stream.get(), false, ring.as<unsigned long long>(), nodes,
           lines);
  }
  owner_stream.synchronize();

  Measurement m{r.name, r.what, {}, "", {}};
  if (sides.same_gpu && r.remote) m.what += " [same GPU: this is local memory]";
  std::vector<long long> host_stamps(size_t(loads) + 1);
  double mean_us = 0;
  // Written before each cold chase: 512 MiB of device writes evict the ring from the owner's L2.
  std::unique_ptr<DeviceBuffer> flush;
  if (r.cold) flush = std::make_unique<DeviceBuffer>(owner, kFlushBytes);
  for (int run = 0; run < options.kernel_runs; ++run) {
    if (flush) {
      DeviceScope scope(owner);
      PROBE_CUDA(cudaMemsetAsync(flush->as<void>(), run + 1, flush->bytes(), owner_stream.get()));
      owner_stream.synchronize();
    }
    {
      DeviceScope scope(sides.device_a);
      launch(chase_kernel, 1, 1, chase_stream.get(), false,
             static_cast<const unsigned long long*>(ring.as<unsigned long long>()), loads, stamps.as<long long>(),
             scratch.as<unsigned long long>(), scratch.as<unsigned long long>() + 1);
    }
    chase_stream.synchronize();
    unsigned long long ns_and_cycles[2] = {0, 0};
    PROBE_CUDA(
        cudaMemcpy(ns_and_cycles, scratch.as<unsigned long long>() + 1, sizeof ns_and_cycles, cudaMemcpyDeviceToHost));
    PROBE_CUDA(cudaMemcpy(host_stamps.data(), stamps.as<long long>(), stamps.bytes(), cudaMemcpyDeviceToHost));
    if (ns_and_cycles[0] == 0 || ns_and_cycles[1] == 0) {
      m.error = "the chase kernel's clocks did not advance";
      return m;
    }
    const double ns_per_cycle = double(ns_and_cycles[0]) / double(ns_and_cycles[1]);
    // Differences from the second on (the first covers no wait); a hot ring
    // skips its first lap (the first touch of each line).
    const unsigned first = r.cold ? 1 : kHotRingNodes + 1;
    for (unsigned i = first; i < loads; ++i) {
      m.samples_us.push_back(cycles_to_us(host_stamps[i + 1] - host_stamps[i], ns_per_cycle));
    }
    mean_us += double(ns_and_cycles[0]) / loads / 1000 / options.kernel_runs;
  }
  if (m.samples_us.empty()) m.error = "--chase-loads is too small for a hot ring (needs more than 65)";
  m.extras.emplace_back("mean_globaltimer_us", mean_us);
  return m;
}

}  // namespace

std::vector<Measurement> measure_dependent_loads(const Sides& sides, const ProbeOptions& options) {
  std::vector<Measurement> out;
  for (const Ring& r : kRings) out.push_back(chase(sides, options, r));
  return out;
}

}  // namespace moe_ep_probe
