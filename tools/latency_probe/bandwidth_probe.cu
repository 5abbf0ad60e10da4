// Group "bw": the bandwidth one SM reaches, measured directly.  For each grid
// size (1, 4, 8, 16, 24 and every SM) blocks of 512 threads, one per SM (each
// asks for more than half of an SM's shared memory), stream over their own
// slices of a large buffer: 16-byte loads and stores from registers (8 per
// thread in flight), local or into the peer's memory; bulk copies
// (cp.async.bulk) from global memory into a ring of shared-memory buffers
// completed on mbarriers; bulk copies from shared memory into the peer's
// memory.  The remote modes run on both GPUs at once (each reads or writes
// the other's memory), released together by a HostGate; every run is timed
// with CUDA events on each GPU's own stream.  A line's samples are GB/s.
#include <memory>
#include <string>
#include <vector>

#include "bandwidth_plan.hpp"
#include "cuda_support.cuh"
#include "host_gate.cuh"

namespace moe_ep_probe {

namespace {

constexpr unsigned kThreads = 512;
constexpr unsigned kWarps = kThreads / 32;
constexpr unsigned kLoadsInFlight = 8;  // 16-byte vectors per thread per step of the register loops
// The bulk rings: 192 KiB of buffers per block whatever the chunk size.
constexpr unsigned kRingBytes = 192u << 10;
constexpr unsigned kStages = 3;
// Every kernel asks for this much dynamic shared memory, more than half of
// what an SM has (228 KiB on sm_90): no SM can hold two blocks, so a grid of
// G <= SMs blocks occupies G SMs.
constexpr unsigned kSharedBytes = kRingBytes + 1024;  // the ring and its barriers
constexpr unsigned kWriteGroupsInFlight = 4;          // bulk stores per warp not yet read out of shared memory

static_assert(kBandwidthSliceGranule % (size_t(kThreads) * kLoadsInFlight * 16) == 0,
              "a slice is a whole number of register-loop steps");
static_assert(kBandwidthSliceGranule % (size_t(kWarps) * 4096) == 0, "a slice is whole 4 KiB chunks per warp");
static_assert(kRingBytes / kStages / (16u << 10) >= 1, "the 16 KiB ring holds at least one warp");

enum Status : unsigned { kOk = 0, kTimedOut = 1, kNoBulkCopy = 2 };

struct StreamArgs {
  const char* src;     // block b reads src + b x slice_bytes (reading modes)
  char* dst;           // block b writes dst + b x slice_bytes (writing modes)
  size_t slice_bytes;  // a multiple of kBandwidthSliceGranule
  unsigned* sink;      // [blocks]: one value per block, so that no load is dead
  unsigned* status;    // Status; set by any thread that gave up
  unsigned long long timeout_ns;
};

// The warp's xor of every lane's `value`, folded into the block's sink word.
__device__ __forceinline__ void keep(const StreamArgs& a, unsigned value) {
  for (int offset = 16; offset > 0; offset >>= 1) value ^= __shfl_xor_sync(0xffffffffu, value, offset);
  if (threadIdx.x % 32 == 0) atomicXor(a.sink + blockIdx.x, value);
}

__device__ __forceinline__ unsigned fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

enum class Access { read, copy, write };

// Register loops: each thread issues kLoadsInFlight independent 16-byte
// loads (or stores) per step, the block's 512 threads covering 64 KiB.
template <Access kAccess>
__global__ void __launch_bounds__(kThreads, 1) register_stream_kernel(StreamArgs a) {
  const size_t vectors = a.slice_bytes / 16;
  const uint4* src = reinterpret_cast<const uint4*>(a.src + blockIdx.x * a.slice_bytes);
  uint4* dst = reinterpret_cast<uint4*>(a.dst + blockIdx.x * a.slice_bytes);
  unsigned acc = 0;
#pragma unroll 1  // exactly kLoadsInFlight accesses per thread in flight, as the lines say
  for (size_t base = threadIdx.x; base < vectors; base += size_t(kThreads) * kLoadsInFlight) {
    if (kAccess == Access::write) {
#pragma unroll
      for (unsigned u = 0; u < kLoadsInFlight; ++u) {
        __stcg(dst + base + u * kThreads, make_uint4(unsigned(base), u, blockIdx.x, 1u));
      }
    } else {
      uint4 v[kLoadsInFlight];
#pragma unroll
      for (unsigned u = 0; u < kLoadsInFlight; ++u) v[u] = __ldcg(src + base + u * kThreads);
#pragma unroll
      for (unsigned u = 0; u < kLoadsInFlight; ++u) {
        if (kAccess == Access::copy) __stcg(dst + base + u * kThreads, v[u]);
        acc ^= fold(v[u]);
      }
    }
  }
  keep(a, acc);
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ bool mbarrier_try_wait(uint64_t* barrier, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(smem(barrier)), "r"(parity)
               : "memory");
  return done != 0;
}

// One lane: announces `bytes` on `barrier`, then copies them from global `src`
// into shared `dst`; the copy's completion completes the barrier's phase.
__device__ __forceinline__ void copy_in(void* dst, const void* src, uint32_t bytes, uint64_t* barrier) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem(barrier)), "r"(bytes) : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem(dst)),
      "l"(src), "r"(bytes), "r"(smem(barrier))
      : "memory");
}
#endif

// Bulk reads: warp w of the first kActiveWarps owns a ring of kRingStages
// buffers of kChunk bytes (the 192 KiB ring split between the warps) and
// streams chunks w, w + kActiveWarps, ... of the block's slice through it.
// Lane 0 keeps kRingStages copies in flight; every lane waits (bounded) for a
// buffer's barrier, reads one 16-byte vector of it, and once the whole warp
// has read it lane 0 refills it.  The same bytes in flight issued by one
// thread (kActiveWarps 1) or by several is what the `_1w` lines compare: the
// pull combine issues every copy of a block from one thread.
template <unsigned kChunk, unsigned kActiveWarps = kRingBytes / kStages / kChunk>
__global__ void __launch_bounds__(kThreads, 1) bulk_read_kernel(StreamArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr unsigned kRingStages = kRingBytes / kActiveWarps / kChunk;
  static_assert(kActiveWarps >= 1 && kActiveWarps <= kWarps, "the ring fits the block");
  static_assert(kRingStages >= 1 && kActiveWarps * kRingStages * 8 <= kSharedBytes - kRingBytes,
                "the barriers fit behind the ring");
  extern __shared__ __align__(128) char shared[];
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= kActiveWarps) return;
  char* buffers = shared + size_t(warp) * kRingStages * kChunk;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared + kRingBytes) + warp * kRingStages;
  const char* src = a.src + blockIdx.x * a.slice_bytes + size_t(warp) * kChunk;
  const size_t chunks = a.slice_bytes / kChunk / kActiveWarps;  // this warp's
  const size_t stride = size_t(kActiveWarps) * kChunk;
  if (lane == 0) {
    for (unsigned s = 0; s < kRingStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(barriers + s)) : "memory");
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (size_t i = 0; i < kRingStages && i < chunks; ++i)
      copy_in(buffers + i * kChunk, src + i * stride, kChunk, barriers + i);
  }
  __syncwarp();
  unsigned acc = 0;
  for (size_t i = 0; i < chunks; ++i) {
    const unsigned stage = unsigned(i % kRingStages);
    const uint32_t parity = uint32_t(i / kRingStages) & 1u;
    const bool arrived = spin_until([&] { return mbarrier_try_wait(barriers + stage, parity); }, a.timeout_ns);
    if (!__all_sync(0xffffffffu, arrived)) {
      if (lane == 0) atomicExch(a.status, unsigned(kTimedOut));
      return;  // the copies still in flight land in a block that is gone: the line fails anyway
    }
    acc ^= fold(reinterpret_cast<const uint4*>(buffers + stage * kChunk)[lane]);
    __syncwarp();  // every lane has read the buffer
    if (lane == 0 && i + kRingStages < chunks) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // those reads before the refill
      copy_in(buffers + stage * kChunk, src + (i + kRingStages) * stride, kChunk, barriers + stage);
    }
  }
  keep(a, acc);
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicExch(a.status, unsigned(kNoBulkCopy));
#endif
}

// Bulk writes: the block fills kChunk bytes of shared memory once; lane 0 of
// each of the first kActiveWarps warps stores it into chunks w,
// w + kActiveWarps, ... of the block's slice, one bulk group per chunk, at
// most kWriteGroupsInFlight + 1 groups not yet read out of shared memory,
// and waits for all its stores to complete before the kernel ends.
template <unsigned kChunk>
__global__ void __launch_bounds__(kThreads, 1) bulk_write_kernel(StreamArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr unsigned kActiveWarps = kRingBytes / kStages / kChunk;
  static_assert(kActiveWarps >= 1 && kActiveWarps <= kWarps, "the writers are warps of the block");
  extern __shared__ __align__(128) char shared[];
  uint4* source = reinterpret_cast<uint4*>(shared);
  for (unsigned v = threadIdx.x; v < kChunk / 16; v += kThreads) source[v] = make_uint4(v, blockIdx.x, 1u, 2u);
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // this thread's stores before the bulk reads
  __syncthreads();
  const unsigned warp = threadIdx.x / 32;
  if (warp >= kActiveWarps || threadIdx.x % 32 != 0) return;
  char* dst = a.dst + blockIdx.x * a.slice_bytes + size_t(warp) * kChunk;
  const size_t chunks = a.slice_bytes / kChunk / kActiveWarps;
  const size_t stride = size_t(kActiveWarps) * kChunk;
  for (size_t i = 0; i < chunks; ++i) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst + i * stride),
                 "r"(smem(shared)), "r"(kChunk)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kWriteGroupsInFlight) : "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
#else
  if (threadIdx.x == 0 && blockIdx.x == 0) atomicExch(a.status, unsigned(kNoBulkCopy));
#endif
}

using StreamKernel = void (*)(StreamArgs);

enum class Memory { local, peer };

struct Mode {
  const char* key;  // the line is bw_<key>_G<blocks>
  const char* what;
  StreamKernel kernel;
  Memory memory;  // peer: both GPUs at once, each streaming the other's memory
  bool bulk;      // needs compute capability 9.0
};

const Mode kModes[] = {
    {"local_read", "16-byte __ldcg loads from the own HBM, 8 per thread in flight",
     register_stream_kernel<Access::read>, Memory::local, false},
    {"local_copy",
     "the same loads, each vector stored to a second own buffer (__stcg); GB/s of data copied (each byte read once "
     "and written once)",
     register_stream_kernel<Access::copy>, Memory::local, false},
    {"remote_read", "16-byte __ldcg loads from the peer's memory, 8 per thread in flight; both GPUs at once",
     register_stream_kernel<Access::read>, Memory::peer, false},
    {"remote_write", "16-byte __stcg stores into the peer's memory, 8 per thread per step; both GPUs at once",
     register_stream_kernel<Access::write>, Memory::peer, false},
    {"bulk_read_local_4k",
     "cp.async.bulk of 4 KiB chunks from the own HBM into shared memory (16 warps x 3 stages, one lane issues, "
     "mbarrier completion, every lane reads one vector)",
     bulk_read_kernel<4096>, Memory::local, true},
    {"bulk_read_local_16k", "as bulk_read_local_4k with 16 KiB chunks (4 warps x 3 stages)", bulk_read_kernel<16384>,
     Memory::local, true},
    {"bulk_read_remote_4k", "as bulk_read_local_4k from the peer's memory; both GPUs at once", bulk_read_kernel<4096>,
     Memory::peer, true},
    {"bulk_read_remote_16k", "as bulk_read_local_16k from the peer's memory; both GPUs at once",
     bulk_read_kernel<16384>, Memory::peer, true},
    {"bulk_read_local_16k_1w", "as bulk_read_local_16k, all 12 stages in one warp (one thread issues every copy)",
     bulk_read_kernel<16384, 1>, Memory::local, true},
    {"bulk_read_remote_16k_1w", "as bulk_read_remote_16k, all 12 stages in one warp (one thread issues every copy)",
     bulk_read_kernel<16384, 1>, Memory::peer, true},
    {"bulk_write_remote_4k",
     "cp.async.bulk.global.shared::cta of 4 KiB chunks (one shared buffer filled once) into the peer's memory, lane "
     "0 of 16 warps, at most 5 groups per warp unread (wait_group.read 4); both GPUs at once",
     bulk_write_kernel<4096>, Memory::peer, true},
    {"bulk_write_remote_16k", "as bulk_write_remote_4k with 16 KiB chunks, lane 0 of 4 warps", bulk_write_kernel<16384>,
     Memory::peer, true},
};

constexpr int kWarmupRuns = 1;
constexpr int kTimedRuns = 5;

// What one GPU streams: its source, destination and scratch words.
struct GpuSide {
  const Stream* stream;
  const DeviceBuffer* src;      // what the kernel reads (own or the peer's)
  const DeviceBuffer* dst;      // what it writes (own or the peer's)
  const DeviceBuffer* scratch;  // own: [0] status, then one sink word per block
};

// The buffers one GPU owns.
struct GpuBuffers {
  DeviceBuffer src, dst, scratch;
  Stream stream;
  GpuBuffers(int device, int max_blocks)
      : src(device, kBandwidthBytesPerKernel),
        dst(device, kBandwidthBytesPerKernel),
        scratch(device, (size_t(max_blocks) + 1) * sizeof(unsigned)),
        stream(device) {}
};

void prepare(StreamKernel kernel, int device) {
  DeviceScope scope(device);
  PROBE_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSharedBytes)));
}

void enqueue(StreamKernel kernel, int blocks, const StreamArgs& args, const Stream& stream) {
  DeviceScope scope(stream.device());
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes;
  config.stream = stream.get();
  PROBE_CUDA(cudaLaunchKernelEx(&config, kernel, args));
}

// Per run and GPU: the kernel's time in ms, or an error.
struct RunTimes {
  std::vector<float> ms;  // per side
  bool gate_expired = false;
  std::string error;
};

// One run: every side's status cleared, all held behind one gate, an event
// before and after each kernel, released together.
RunTimes run_once(const Mode& mode, int blocks, size_t slice, const std::vector<GpuSide>& sides, HostGate& gate,
                  unsigned long long timeout_ns) {
  std::vector<std::unique_ptr<Event>> begin, end;
  for (const GpuSide& s : sides) {
    begin.push_back(std::make_unique<Event>(s.stream->device()));
    end.push_back(std::make_unique<Event>(s.stream->device()));
  }
  try {
    for (size_t k = 0; k < sides.size(); ++k) {
      const GpuSide& s = sides[k];
      {
        DeviceScope scope(s.stream->device());
        PROBE_CUDA(cudaMemsetAsync(s.scratch->as<void>(), 0, sizeof(unsigned), s.stream->get()));
      }
      gate.hold(*s.stream, timeout_ns);
      StreamArgs args = {};
      args.src = s.src->as<const char>();  // both always valid: each kernel touches only what its mode uses
      args.dst = s.dst->as<char>();
      args.slice_bytes = slice;
      args.status = s.scratch->as<unsigned>();
      args.sink = s.scratch->as<unsigned>() + 1;
      args.timeout_ns = timeout_ns;
      DeviceScope scope(s.stream->device());
      PROBE_CUDA(cudaEventRecord(begin[k]->get(), s.stream->get()));
      enqueue(mode.kernel, blocks, args, *s.stream);
      PROBE_CUDA(cudaEventRecord(end[k]->get(), s.stream->get()));
    }
  } catch (...) {
    // Nothing may still poll the gate's host memory when it is freed.
    gate.open();
    for (const GpuSide& s : sides) cudaStreamSynchronize(s.stream->get());
    cudaGetLastError();
    throw;
  }
  gate.open();
  for (const GpuSide& s : sides) s.stream->synchronize();
  RunTimes out;
  out.gate_expired = gate.take_expired();
  for (size_t k = 0; k < sides.size(); ++k) {
    unsigned status = 0;
    PROBE_CUDA(cudaMemcpy(&status, sides[k].scratch->as<unsigned>(), sizeof status, cudaMemcpyDeviceToHost));
    if (status == kTimedOut) {
      out.error =
          std::string("timeout: a bulk copy's barrier wait on side ") + (k == 0 ? "A" : "B") + " passed --timeout-ms";
    } else if (status == kNoBulkCopy) {
      out.error = "the kernel was built without cp.async.bulk (compute capability 9.0 code is needed)";
    } else if (status != kOk) {
      out.error = "unexpected status " + std::to_string(status);
    }
    if (!out.error.empty()) return out;
    float ms = 0;
    PROBE_CUDA(cudaEventElapsedTime(&ms, begin[k]->get(), end[k]->get()));
    out.ms.push_back(ms);
  }
  return out;
}

double median_of(std::vector<double> v) { return summarize(std::move(v)).median; }

Measurement measure_line(const Mode& mode, int blocks, const Sides& sides, const ProbeOptions& options,
                         const std::vector<GpuSide>& gpus, HostGate& gate) {
  const std::string name = std::string("bw_") + mode.key + "_G" + std::to_string(blocks);
  const size_t slice =
      bandwidth_slice_bytes(blocks, kBandwidthBytesPerBlock, kBandwidthBytesPerKernel, kBandwidthSliceGranule);
  const double bytes = double(slice) * blocks;
  std::string what = std::string(mode.what) + "; " + std::to_string(blocks) + " block(s) x 512 threads, one per SM, " +
                     std::to_string(slice >> 10) + " KiB each; samples in GB/s (not us), per GPU";
  if (mode.memory == Memory::peer && sides.same_gpu) what += " [same GPU: not NVLink; GPU 0's own memory]";
  Measurement m{name, what, {}, "", {}};
  m.unit = "GB/s";
  try {
    int per_sm = 0;
    PROBE_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mode.kernel, int(kThreads), kSharedBytes));
    if (per_sm != 1) {
      m.error = "expected exactly one block per SM, the occupancy calculator allows " + std::to_string(per_sm);
      return m;
    }
    std::vector<double> side_b;
    int gates_expired = 0;
    for (int run = 0; run < kWarmupRuns + kTimedRuns; ++run) {
      const RunTimes t = run_once(mode, blocks, slice, gpus, gate, 1000000ull * unsigned(options.timeout_ms));
      if (!t.error.empty()) {
        m.error = t.error + " (run " + std::to_string(run + 1) + ")";
        m.samples_us.clear();
        return m;
      }
      if (run < kWarmupRuns) continue;
      gates_expired += t.gate_expired ? 1 : 0;
      m.samples_us.push_back(gigabytes_per_second(bytes, t.ms[0]));
      if (t.ms.size() > 1) side_b.push_back(gigabytes_per_second(bytes, t.ms[1]));
    }
    const double median = median_of(m.samples_us);
    m.extras.emplace_back("per_sm_GBps", median / blocks);
    if (!side_b.empty()) {
      const double b = median_of(side_b);
      m.extras.emplace_back("side_b_GBps", b);
      m.extras.emplace_back("side_b_per_sm_GBps", b / blocks);
    }
    if (gates_expired > 0) m.extras.emplace_back("runs_gate_expired", gates_expired);
  } catch (const ProbeError& e) {
    m.error = e.what();
    m.samples_us.clear();
  }
  return m;
}

}  // namespace

std::vector<Measurement> measure_sm_bandwidth(const Sides& sides, const ProbeOptions& options) {
  int sm_count = 0, shared_optin = 0, major = 0;
  PROBE_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, sides.device_a));
  PROBE_CUDA(cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, sides.device_a));
  PROBE_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, sides.device_a));
  const std::vector<int> grids = bandwidth_grids(sm_count);
  if (grids.empty()) throw ProbeError("cudaDevAttrMultiProcessorCount reports " + std::to_string(sm_count) + " SMs");
  if (shared_optin < int(kSharedBytes)) {
    return {{"bw",
             "per-SM bandwidth",
             {},
             "needs " + std::to_string(kSharedBytes) + " bytes of shared memory per block, the device allows " +
                 std::to_string(shared_optin),
             {}}};
  }
  const bool two_gpus = !sides.same_gpu;
  GpuBuffers a(sides.device_a, grids.back());
  std::unique_ptr<GpuBuffers> b;
  if (two_gpus) b = std::make_unique<GpuBuffers>(sides.device_b, grids.back());
  HostGate gate;

  std::vector<Measurement> out;
  for (const Mode& mode : kModes) {
    std::vector<GpuSide> gpus;
    if (mode.memory == Memory::local) {
      gpus.push_back({&a.stream, &a.src, &a.dst, &a.scratch});
    } else if (two_gpus) {
      gpus.push_back({&a.stream, &b->src, &b->dst, &a.scratch});
      gpus.push_back({&b->stream, &a.src, &a.dst, &b->scratch});
    } else {
      gpus.push_back({&a.stream, &a.src, &a.dst, &a.scratch});  // the "peer" is GPU 0 itself
    }
    for (const GpuSide& g : gpus) prepare(mode.kernel, g.stream->device());
    for (int blocks : grids) {
      if (mode.bulk && major < 9) {
        out.push_back({std::string("bw_") + mode.key + "_G" + std::to_string(blocks),
                       mode.what,
                       {},
                       "cp.async.bulk needs compute capability 9.0, the device has " + std::to_string(major) + ".x",
                       {}});
        continue;
      }
      out.push_back(measure_line(mode, blocks, sides, options, gpus, gate));
    }
  }
  return out;
}

}  // namespace moe_ep_probe
