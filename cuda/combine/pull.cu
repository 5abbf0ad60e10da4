// Combine, pull schedule (config.zero_copy_combine): every rank's expert
// output is in its shared combine_input view before its combine starts
// (written there by its experts, or copied there by the host code in stream
// order), so each source rank sums its tokens' partials straight from the
// views of the ranks that computed them.  Each row crosses NVLink once, in one
// pass: no push, no staging region, no fence, no publication counter.
//
// Protocol: block 0 stores "started N" at every peer at kernel start; every
// block waits for every peer's "started N" before reading any view.  That wait
// (for every peer, not only those holding this block's rows) is also what
// releases the peers' receive rows to this rank's next dispatch; a peer
// rewrites its view only after its next dispatch has completed, which needs
// this rank's next dispatch, issued after this kernel ended
// (docs/nvlink_backend.md, "Combine"; model-checked in test_reuse_protocol_model).
//
// A split combine (CombineLaunch::part): the send half is the announcement
// alone, in one block; the receive half waits and pulls.
//
// Loads, one of four ways (the partials are always added in ascending rank
// order in fp32 from 0.0f, as every schedule does, so all four give the same
// bits):
//   whole rows (default, rows of at most 16 KiB, 16-byte aligned): per block,
//     1 to 4 producer warps (MOE_EP_PULL_PRODUCERS) issue a bulk copy of each
//     partial row into buffers of two rows (a step carries up to two partials
//     of a token) and the other warps add them (pull_reduce_whole_rows);
//   2 KiB segments (MOE_EP_PULL_ROWS=0): each warp walks its (token, segment)
//     items and issues its own bulk copies, up to kPullStages ahead
//     (pull_reduce_bulk);
//   registers (a device without bulk copies; the host's path selection
//     chooses it, src/nvlink/path_selection.cpp): 16-byte loads
//     (pull_reduce_registers);
//   any other row: element by element (pull_reduce_rows).
#include <stdint.h>

#include <atomic>

#include "combine/common.cuh"
#include "combine/pull_rows.cuh"
#include "combine/pull_segments.cuh"
#include "combine/reduce.cuh"
#include "common/bulk_copy.cuh"
#include "common/device_sync.cuh"
#include "common/kernel_launch.cuh"
#include "common/split_ready.cuh"

namespace moe_ep {
namespace kernels {
namespace {

template <typename Element>
__device__ void pull_reduce(const CombineParams& p, char* shared) {
  if (combine_rows_aligned(p)) {
#ifdef MOE_EP_HAVE_BULK_COPY
    if (pull_rows_applies(p)) {
      pull_reduce_whole_rows<Element>(p, shared);
      return;
    }
    if (p.args.pull_registers == 0) {
      pull_reduce_bulk<Element>(p, shared);
      return;
    }
#endif
    pull_reduce_registers<Element>(p);
    return;
  }
  (void)shared;
  pull_reduce_rows<Element>(p);
}

// "Started N" at every peer (by the block that `announces`): this rank's view
// holds its expert output N, written by earlier work in stream order.  Then
// the wait for every peer's "started N"; a failed wait sets *failed.
// kReleasable: a split receive half's waits (bounded_wait).
template <bool kReleasable>
__device__ void handshake(const KernelContext& c, uint64_t epoch, bool announces, int32_t* failed) {
  const GroupShape& s = c.shape;
  if (announces) {
    for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
      if (q != s.rank) store_release_sys(c.remote<uint64_t>(q, c.offsets.combine_started) + s.rank, epoch);
    }
  }
  for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
    if (q == s.rank) continue;
    if (!wait_until_at_least<kReleasable>(c.local<uint64_t>(c.offsets.combine_started) + q, epoch, c.control(),
                                          c.state.mirror, c.state.timeout_ns, kPhaseCombine, q)) {
      *failed = 1;
    }
  }
}

// A split combine's send half: the announcement alone (the receive half
// pulls); the ready words follow it, so that a peer's stream wait ends only
// when its kernel finds "started N" here.
__device__ void announce_then_ready(const KernelContext& c, uint64_t epoch) {
  const GroupShape& s = c.shape;
  for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
    if (q != s.rank) store_release_sys(c.remote<uint64_t>(q, c.offsets.combine_started) + s.rank, epoch);
  }
  const uint64_t absent = threadIdx.x == 0 ? absent_ranks(c.control()) : 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    fence_acq_rel_sys();
    add_ready_at_peers(c, c.offsets.combine_ready, static_cast<uint32_t>(kArrivalsPerCall), absent);  // one block: all
  }
}

// kPart: CombineLaunch::part (a template argument, so that the fused kernel
// compiles as if the split did not exist).
template <int32_t kPart>
__global__ void __launch_bounds__(kBlockThreads, 1) combine_pull_kernel(const CombineParams p) {
  extern __shared__ __align__(128) char pull_shared[];
  __shared__ uint32_t timed_out;
  __shared__ int32_t failed;
  wait_for_prior_grid();
  allow_dependent_launch();
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  ControlBlock* control = c.control();
  if (threadIdx.x == 0) {
    timed_out = *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase);
    failed = 0;
  }
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch);
  constexpr int32_t part = kPart;
  __syncthreads();
  if (timed_out != kPhaseNone) {  // block-uniform
    if (part == kPartReceive && blockIdx.x == 0 && threadIdx.x == 0) end_receive(c, c.offsets.combine_ready);
    return;
  }
  if (part == kPartSend) {  // one block: "started N" at every peer, then their ready words; no wait
    announce_then_ready(c, epoch);
    return;
  }
  handshake<part == kPartReceive>(c, epoch, part == kPartFused && blockIdx.x == 0, &failed);
  __syncthreads();  // the waiters' acquires order every thread's reads of the peers' views
  if (part == kPartReceive && blockIdx.x == 0 && threadIdx.x == 0) end_receive(c, c.offsets.combine_ready);
  if (failed) return;
  switch (s.combine_dtype) {
    case kCombineBf16: pull_reduce<Bf16Element>(p, pull_shared); break;
    case kCombineFp16: pull_reduce<Fp16Element>(p, pull_shared); break;
    default: pull_reduce<Fp32Element>(p, pull_shared); break;
  }
}

}  // namespace

// Shared memory of the pull kernel: the larger of the two bulk-copy layouts.
constexpr size_t kPullSharedBytes =
    kPullSegmentSharedBytes > kRowSharedBytes ? kPullSegmentSharedBytes : kRowSharedBytes;

cudaError_t launch_combine_pull(const CombineParams& p, cudaStream_t stream) {
  // The kernel's shared-memory limit is raised once per device, not on every
  // call (combine is on the caller's hot path).
  // The send half is one block without the pull's shared memory.
  if (p.args.part == kPartSend) {
    return launch_kernel(combine_pull_kernel<kPartSend>, 1, kBlockThreads, 0, stream, p.args.pdl, p);
  }
  static std::atomic<uint64_t> raised_on_devices[2];  // [receive half]
  const bool receive = p.args.part == kPartReceive;
  void (*kernel)(CombineParams) = receive ? combine_pull_kernel<kPartReceive> : combine_pull_kernel<kPartFused>;
  const cudaError_t e = raise_dynamic_shared_limit_once(kernel, kPullSharedBytes, &raised_on_devices[receive]);
  if (e != cudaSuccess) return e;
  return launch_kernel(kernel, p.args.num_blocks, kBlockThreads, kPullSharedBytes, stream, p.args.pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
