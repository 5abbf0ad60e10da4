// Combine, push schedules (the pull schedule of config.zero_copy_combine is
// combine/pull.cu): one kernel per call.  Every row this rank received from a peer s
// (rows s*tpr + j, j < recv_count[s]) goes back to s's combine_in region
// (segment of this rank, row j); each local token then sums its partials over
// ranks in ascending rank order, in fp32 starting from 0.0f exactly as the
// HOST backend does.  Two schedules:
//   serial: every block pushes its share, counts in at every peer, waits for
//     every peer, then reduces its share of tokens;
//   overlapped: push blocks send the rows in a few phases (slot ranges), each
//     published by per-block counter adds, while reduce blocks sum a token as
//     soon as the phases holding its rows have landed, so the reduction
//     overlaps the NVLink traffic instead of following it.
// Overlapped: block 0 also tells every peer at once that this combine has started: a rank
// finishes its combine only after every peer's "started" flag, which is what
// lets the next dispatch reuse the single receive region (docs/nvlink_backend.md).
#include <stdint.h>

#include "combine/common.cuh"
#include "combine/reduce.cuh"
#include "common/device_sync.cuh"
#include "common/float_convert.cuh"
#include "common/kernel_common.cuh"
#include "common/kernel_launch.cuh"
#include "common/row_copy.cuh"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

__device__ __forceinline__ int combine_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_partial_bytes + kSegmentBytes - 1) / kSegmentBytes) : 1;
}

// How the grid splits into push blocks [0, push) and reduce blocks
// [grid - reduce, grid); a grid of one block does both, pushes first.
struct Roles {
  int push;
  int reduce;
  __device__ Roles(int world, int grid, int reduce_blocks) {
    if (world == 1) {
      push = 0;
      reduce = grid;
    } else if (grid == 1) {
      push = 1;
      reduce = 1;
    } else {
      reduce = reduce_blocks > 0 ? reduce_blocks : grid * 5 / 11;  // 60 of 132 SMs
      if (reduce > grid - 1) reduce = grid - 1;
      if (reduce < 1) reduce = 1;
      push = grid - reduce;
    }
  }
};

// One segment of row j received from `peer`, pushed back to it (warp).
__device__ inline void push_row_segment(const CombineParams& p, int peer, int64_t j, int segment, bool aligned) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int lane = threadIdx.x % 32;
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row_bytes = s.combine_partial_bytes;
  const char* src = static_cast<const char*>(p.args.expert_output) + (peer * tpr + j) * row_bytes;
  char* dst = c.rank_base(peer) + c.offsets.combine_in + (c.combine_segment(s.rank, peer) * tpr + j) * row_bytes;
  if (!aligned) {
    warp_copy_bytes(dst, src, row_bytes, lane);
    return;
  }
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  const int vectors = static_cast<int>((row_bytes - offset < kSegmentBytes ? row_bytes - offset : kSegmentBytes) / 16);
  const uint4* src_v = reinterpret_cast<const uint4*>(src + offset);
  uint4* dst_v = reinterpret_cast<uint4*>(dst + offset);
  uint4 v[kVectorsPerLane];
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) v[u] = __ldg(src_v + u * 32 + lane);
  }
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) dst_v[u * 32 + lane] = v[u];
  }
}

// Push role.  The rows go back in phases: phase c holds the rows of slots
// [c*R, (c+1)*R) received from every peer (R = chunk_rows, chosen so that
// the same number of phases covers any tokens_per_rank), dealt as
// (row, segment) items to the push warps of every push block.  After each
// phase a block counts in at every peer (barrier, one system fence, one add
// per peer on counters[this rank][c]; the weights of the push blocks sum to
// kArrivalsPerCall, see arrival_weight), so a peer reduces the tokens of phase
// c while phase c+1 is on its way.  Every phase is published, empty or not,
// in every call: a counter reaches epoch * kArrivalsPerCall after call epoch.
// In a grid of several blocks, warp 0 of a push block only publishes: its
// fence never holds back the stores of the next phase.
__device__ void push_rows(const CombineParams& p, const int32_t* counts, int push_blocks, bool aligned) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int64_t rows_per_phase = p.chunk_rows;
  const int64_t phases = p.phases;
  const int segments = combine_segments(p, aligned);
  const int first_warp = gridDim.x > 1 ? 1 : 0;
  const int warps_per_block = kWarpsPerBlock - first_warp;
  const int warp = static_cast<int>(threadIdx.x / 32) - first_warp;
  const uint64_t weight = blockIdx.x == 0 ? kArrivalsPerCall - static_cast<uint64_t>(push_blocks - 1) : uint64_t{1};
  for (int64_t phase = 0; phase < phases; ++phase) {
    const int64_t first = phase * rows_per_phase;
    if (warp >= 0) {
      int64_t rows = 0;
      for (int r = 0; r < s.world_size; ++r) {
        if (r == s.rank) continue;
        const int64_t n = counts[r] - first;
        rows += n <= 0 ? 0 : (n < rows_per_phase ? n : rows_per_phase);
      }
      const int64_t step = static_cast<int64_t>(push_blocks) * warps_per_block;
      for (int64_t item = static_cast<int64_t>(blockIdx.x) * warps_per_block + warp; item < rows * segments;
           item += step) {
        int64_t j = item / segments;
        int peer = 0;
        for (;; ++peer) {
          if (peer == s.rank) continue;
          int64_t n = counts[peer] - first;
          n = n <= 0 ? 0 : (n < rows_per_phase ? n : rows_per_phase);
          if (j < n) break;
          j -= n;
        }
        push_row_segment(p, peer, first + j, static_cast<int>(item % segments), aligned);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const uint64_t absent = absent_ranks(c.control());  // loaded before the fence, which hides it
      fence_acq_rel_sys();
      for (int q = 0; q < s.world_size; ++q) {
        if (q == s.rank || ((absent >> q) & 1u) != 0) continue;  // nothing to an absent rank
        red_relaxed_sys_add(c.remote<uint64_t>(q, c.offsets.combine_chunk_flags) +
                                static_cast<int64_t>(s.rank) * s.max_tokens_per_rank + phase,
                            weight);
        // After the last phase, also the serial schedule's counter, which
        // thus advances by kArrivalsPerCall in every call whatever the schedule.
        if (phase == phases - 1) {
          red_relaxed_sys_add(c.remote<uint64_t>(q, c.offsets.combine_arrivals) + s.rank, weight);
        }
      }
    }
  }
}

// Lane q waits for the phase holding this token's row from rank q (and lane
// q for rank q + 32).  Phases seen landed are remembered per lane: a warp's
// tokens ascend, so the phase it needs from a rank never goes back.
__device__ __forceinline__ bool wait_one_partial(const CombineParams& p, int q, int32_t slot, int64_t* ready,
                                                 uint64_t epoch) {
  const KernelContext& c = p.ctx;
  if (q >= c.shape.world_size || q == c.shape.rank || slot < 0) return true;
  const int64_t chunk = slot / p.chunk_rows;
  if (chunk == *ready) return true;
  const uint64_t* flag =
      c.local<uint64_t>(c.offsets.combine_chunk_flags) + static_cast<int64_t>(q) * c.shape.max_tokens_per_rank + chunk;
  if (!wait_until_at_least(flag, epoch * kArrivalsPerCall, c.control(), c.state.mirror, c.state.timeout_ns,
                           kPhaseCombine, q)) {
    return false;
  }
  *ready = chunk;
  return true;
}

__device__ __forceinline__ bool wait_for_partials(const CombineParams& p, const TokenDestinations& srcs, int lane,
                                                  int64_t* ready_low, int64_t* ready_high, uint64_t epoch) {
  bool ok = wait_one_partial(p, lane, srcs.slot_low, ready_low, epoch);
  ok = wait_one_partial(p, lane + 32, srcs.slot_high, ready_high, epoch) && ok;
  ok = __all_sync(0xFFFFFFFFu, ok);
  __syncwarp();  // the lanes' acquires order the whole warp's reads of the rows
  return ok;
}

// Reduce role: (token, segment) items in ascending token order over the
// reduce warps of the grid.
template <typename Element>
__device__ void reduce_tokens(const CombineParams& p, const Roles& roles, bool aligned, uint64_t epoch,
                              bool wait_chunks) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int segments = reduce_segments(p, aligned);
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t warps = static_cast<int64_t>(roles.reduce) * kWarpsPerBlock;
  const int64_t first_block = gridDim.x - roles.reduce;
  int64_t ready_low = -1, ready_high = -1;
  for (int64_t item = (blockIdx.x - first_block) * kWarpsPerBlock + threadIdx.x / 32; item < items; item += warps) {
    const int32_t token = static_cast<int32_t>(item / segments);
    const TokenDestinations srcs =
        TokenDestinations::load(slots + static_cast<int64_t>(token) * s.world_size, s.world_size, lane);
    if (wait_chunks && !wait_for_partials(p, srcs, lane, &ready_low, &ready_high, epoch)) return;
    reduce_token<Element>(p, token, static_cast<int>(item % segments), srcs, aligned, lane);
  }
}

// Every peer has started this combine, hence consumed its dispatch rows: the
// condition for this rank's next dispatch to write into them.
__device__ void wait_for_peers_started(const CombineParams& p, uint64_t epoch) {
  const KernelContext& c = p.ctx;
  for (int q = threadIdx.x; q < c.shape.world_size; q += blockDim.x) {
    if (q == c.shape.rank) continue;
    wait_until_at_least(c.local<uint64_t>(c.offsets.combine_started) + q, epoch, c.control(), c.state.mirror,
                        c.state.timeout_ns, kPhaseCombine, q);
  }
}

// Serial schedule, push part: rows numbered over the peers in rank order,
// (row, segment) items dealt to every warp of the grid.
__device__ void push_rows_interleaved(const CombineParams& p, const int32_t* counts, bool aligned) {
  const GroupShape& s = p.ctx.shape;
  const int segments = combine_segments(p, aligned);
  int64_t rows = 0;
  for (int r = 0; r < s.world_size; ++r) rows += r == s.rank ? 0 : counts[r];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < rows * segments;
       item += warps) {
    int64_t j = item / segments;
    int peer = 0;
    while (peer == s.rank || j >= counts[peer]) {
      if (peer != s.rank) j -= counts[peer];
      ++peer;
    }
    push_row_segment(p, peer, j, static_cast<int>(item % segments), aligned);
  }
}

// Serial schedule, publication: after a barrier, one fence, then the block
// counts in at every peer (a send half also adds to the peer's ready word,
// common/split_ready.cuh).  Block 0 also advances every phase counter of the
// overlapped schedule by kArrivalsPerCall, so that both kinds of counters
// advance by that much in every call whatever the schedule (every rank runs
// the same schedule in a call, so no peer reads the phase counters now).
template <int32_t kPart = kPartFused>
__device__ void publish_serial_arrival(const CombineParams& p) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  __syncthreads();
  if (threadIdx.x == 0) {
    // Nothing to an absent rank; its share of the ready word is this rank's
    // to add (common/split_ready.cuh).  Loaded before the fence, which hides it.
    const uint64_t absent = absent_ranks(c.control());
    fence_acq_rel_sys();
    const uint64_t weight = arrival_weight();
    if (kPart == kPartSend && absent != 0) {
      red_relaxed_sys_add(c.local<uint32_t>(c.offsets.combine_ready), static_cast<uint32_t>(weight) * __popcll(absent));
    }
    for (int i = 1; i < s.world_size; ++i) {
      const int q = (s.rank + i) % s.world_size;
      if ((absent >> q) & 1u) continue;
      red_relaxed_sys_add(c.remote<uint64_t>(q, c.offsets.combine_arrivals) + s.rank, weight);
      if (kPart == kPartSend) red_relaxed_sys_add(c.remote<uint32_t>(q, c.offsets.combine_ready), weight);
      if (blockIdx.x != 0) continue;
      uint64_t* phase_counters =
          c.remote<uint64_t>(q, c.offsets.combine_chunk_flags) + static_cast<int64_t>(s.rank) * s.max_tokens_per_rank;
      for (int phase = 0; phase < p.phases; ++phase) red_relaxed_sys_add(phase_counters + phase, kArrivalsPerCall);
    }
  }
}

// The end of a split combine's waits: one thread of the receive kernel
// takes back the ready word and tells the watchdog (common/split_ready.cuh).
template <int32_t kPart>
__device__ __forceinline__ void end_combine_receive(const CombineParams& p) {
  if (kPart == kPartReceive && blockIdx.x == 0 && threadIdx.x == 0) end_receive(p.ctx, p.ctx.offsets.combine_ready);
}

// A split combine's send half pushes and publishes, its receive half waits
// and reduces (kPart: CombineLaunch::part, a template argument so that the
// fused kernels compile as if the split did not exist).
template <typename Element, int32_t kPart>
__device__ void combine_serial(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  const KernelContext& c = p.ctx;
  if (kPart != kPartReceive) {
    push_rows_interleaved(p, counts, aligned);
    publish_serial_arrival<kPart>(p);
    if (kPart == kPartSend) return;
  }
  __shared__ int32_t failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int q = threadIdx.x; q < c.shape.world_size; q += blockDim.x) {
    if (q == c.shape.rank) continue;
    if (!wait_until_at_least<kPart == kPartReceive>(c.local<uint64_t>(c.offsets.combine_arrivals) + q,
                                                    epoch * kArrivalsPerCall, c.control(), c.state.mirror,
                                                    c.state.timeout_ns, kPhaseCombine, q)) {
      failed = 1;
    }
  }
  __syncthreads();
  end_combine_receive<kPart>(p);
  if (failed) return;
  reduce_tokens<Element>(p, Roles(1, gridDim.x, 0), aligned, epoch, false);
}

template <typename Element>
__device__ void combine_overlapped(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  const GroupShape& s = p.ctx.shape;
  const Roles roles(s.world_size, gridDim.x, p.args.reduce_blocks);
  if (static_cast<int>(blockIdx.x) < roles.push) push_rows(p, counts, roles.push, aligned);
  if (static_cast<int>(blockIdx.x) >= static_cast<int>(gridDim.x) - roles.reduce) {
    reduce_tokens<Element>(p, roles, aligned, epoch, true);
  }
  if (blockIdx.x == gridDim.x - 1) wait_for_peers_started(p, epoch);
}

template <typename Element, int32_t kPart>
__device__ void combine_body(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  // Resolved by launch_combine: never kCombineAuto here; split calls are serial.
  if (kPart == kPartFused && p.args.schedule == kCombineOverlapped) {
    combine_overlapped<Element>(p, counts, aligned, epoch);
  } else {
    combine_serial<Element, kPart>(p, counts, aligned, epoch);
  }
}

template <int32_t kPart, bool kWire>
__global__ void __launch_bounds__(kBlockThreads, 1) combine_kernel(const CombineParams p) {
  __shared__ int32_t counts[kMaxWorldSize];
  __shared__ uint32_t timed_out;
  wait_for_prior_grid();
  allow_dependent_launch();
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  ControlBlock* control = c.control();
  // Independent loads first, all in flight at once: the timeout record, the
  // epoch and the row counts.
  if (threadIdx.x == 0) timed_out = *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase);
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch);
  const volatile int32_t* counts_private = c.local<int32_t>(c.offsets.counts_private);
  const int32_t my_count = static_cast<int>(threadIdx.x) < s.world_size ? counts_private[threadIdx.x] : 0;
  const bool aligned = combine_rows_aligned(p);
  if (static_cast<int>(threadIdx.x) < s.world_size) counts[threadIdx.x] = my_count;
  __syncthreads();
  if (timed_out != kPhaseNone) {  // block-uniform
    end_combine_receive<kPart>(p);
    return;
  }
  if (kPart == kPartFused && blockIdx.x == 0 &&
      p.args.schedule == kCombineOverlapped) {  // "started"; nothing to order before it
    for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
      if (q != s.rank) store_release_sys(c.remote<uint64_t>(q, c.offsets.combine_started) + s.rank, epoch);
    }
  }
  switch (s.combine_dtype) {
    case kCombineBf16:
      combine_body<typename SelectPartials<Bf16Element, kWire>::type, kPart>(p, counts, aligned, epoch);
      break;
    case kCombineFp16:
      combine_body<typename SelectPartials<Fp16Element, kWire>::type, kPart>(p, counts, aligned, epoch);
      break;
    default: combine_body<typename SelectPartials<Fp32Element, kWire>::type, kPart>(p, counts, aligned, epoch); break;
  }
}

// ---- Small-batch kernel (serial schedule, tokens_per_rank <= kSmallCombineMaxTokens) ----
// The serial schedule's protocol and results (same counters, same weights:
// publish_serial_arrival), with two dependent loads taken off the path of a
// small call (docs/nvlink_backend.md): push items are mapped statically
// over (peer, slot < tpr, segment), so a warp's first row segment is loaded at
// kernel start together with the row counts (and skipped when that slot is not
// used); and a warp loads its first reduce token's slots row before waiting
// for the peers, so that after the wait the partials are loaded at once.
struct SmallPushItem {
  int peer;
  int64_t j;
  int segment;
};

__device__ __forceinline__ SmallPushItem small_push_item(const CombineParams& p, int64_t item, int segments) {
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row = item / segments;
  const int index = static_cast<int>(row / tpr);  // peers in rank order, this rank skipped
  SmallPushItem it;
  it.segment = static_cast<int>(item % segments);
  it.j = row % tpr;
  it.peer = index < p.ctx.shape.rank ? index : index + 1;
  return it;
}

__device__ __forceinline__ int push_segment_vectors(const CombineParams& p, int segment) {
  const int64_t row_bytes = p.ctx.shape.combine_partial_bytes;
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  return static_cast<int>((row_bytes - offset < kSegmentBytes ? row_bytes - offset : kSegmentBytes) / 16);
}

// Aligned rows only.
__device__ __forceinline__ void load_push_segment(const CombineParams& p, const SmallPushItem& it, int lane,
                                                  uint4 (&v)[kVectorsPerLane]) {
  const int64_t row_bytes = p.ctx.shape.combine_partial_bytes;
  const int vectors = push_segment_vectors(p, it.segment);
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.args.expert_output) +
                                                    (it.peer * p.args.tokens_per_rank + it.j) * row_bytes +
                                                    static_cast<int64_t>(it.segment) * kSegmentBytes);
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) v[u] = __ldg(src + u * 32 + lane);
  }
}

__device__ __forceinline__ void store_push_segment(const CombineParams& p, const SmallPushItem& it, int lane,
                                                   const uint4 (&v)[kVectorsPerLane]) {
  const KernelContext& c = p.ctx;
  const int64_t row_bytes = c.shape.combine_partial_bytes;
  const int vectors = push_segment_vectors(p, it.segment);
  uint4* dst =
      reinterpret_cast<uint4*>(c.rank_base(it.peer) + c.offsets.combine_in +
                               (c.combine_segment(c.shape.rank, it.peer) * p.args.tokens_per_rank + it.j) * row_bytes +
                               static_cast<int64_t>(it.segment) * kSegmentBytes);
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) dst[u * 32 + lane] = v[u];
  }
}

template <typename Element, int32_t kPart>
__device__ void combine_small(const CombineParams& p, int32_t* counts, uint32_t* timed_out_shared, int32_t* failed) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int world = s.world_size;
  const int lane = threadIdx.x % 32;
  ControlBlock* control = c.control();
  // Every load that needs nothing from a peer first, all in flight at once.
  const uint32_t timed_out =
      threadIdx.x == 0 ? *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase) : 0u;
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch);
  const volatile int32_t* counts_private = c.local<int32_t>(c.offsets.counts_private);
  const int32_t my_count = static_cast<int>(threadIdx.x) < world ? counts_private[threadIdx.x] : 0;
  const bool aligned = combine_rows_aligned(p);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t first_item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const int segments = combine_segments(p, aligned);
  constexpr bool sends = kPart != kPartReceive, receives = kPart != kPartSend;  // split halves
  const int64_t push_items = sends ? static_cast<int64_t>(world - 1) * p.args.tokens_per_rank * segments : 0;
  uint4 pushed[kVectorsPerLane];
  if (aligned && first_item < push_items) load_push_segment(p, small_push_item(p, first_item, segments), lane, pushed);
  const int rsegments = reduce_segments(p, aligned);
  const int64_t reduce_items = receives ? static_cast<int64_t>(p.args.num_tokens) * rsegments : 0;
  const int32_t* slots = c.local<int32_t>(c.offsets.token_slots);
  TokenDestinations first_srcs{};
  if (first_item < reduce_items) {  // warp-uniform
    first_srcs = TokenDestinations::load(slots + first_item / rsegments * world, world, lane);
  }
  if (threadIdx.x == 0) {
    *timed_out_shared = timed_out;
    *failed = 0;
  }
  if (static_cast<int>(threadIdx.x) < world) counts[threadIdx.x] = my_count;
  __syncthreads();
  if (*timed_out_shared != kPhaseNone) {  // block-uniform
    end_combine_receive<kPart>(p);
    return;
  }

  if (first_item < push_items) {  // the prefetched item, peeled off: its registers die here
    const SmallPushItem it = small_push_item(p, first_item, segments);
    if (it.j < counts[it.peer]) {  // warp-uniform
      if (aligned) {
        store_push_segment(p, it, lane, pushed);
      } else {
        push_row_segment(p, it.peer, it.j, it.segment, aligned);
      }
    }
  }
  for (int64_t item = first_item + warps; item < push_items; item += warps) {
    const SmallPushItem it = small_push_item(p, item, segments);
    if (it.j < counts[it.peer]) push_row_segment(p, it.peer, it.j, it.segment, aligned);
  }
  if (sends) publish_serial_arrival<kPart>(p);  // starts with a barrier
  if constexpr (receives) {                     // the send half ends here
    for (int q = threadIdx.x; q < world; q += blockDim.x) {
      if (q == s.rank) continue;
      if (!wait_until_at_least<kPart == kPartReceive>(c.local<uint64_t>(c.offsets.combine_arrivals) + q,
                                                      epoch * kArrivalsPerCall, control, c.state.mirror,
                                                      c.state.timeout_ns, kPhaseCombine, q)) {
        *failed = 1;
      }
    }
    __syncthreads();
    end_combine_receive<kPart>(p);
    if (*failed) return;
    for (int64_t item = first_item; item < reduce_items; item += warps) {
      const int32_t token = static_cast<int32_t>(item / rsegments);
      const TokenDestinations srcs =
          item == first_item ? first_srcs
                             : TokenDestinations::load(slots + static_cast<int64_t>(token) * world, world, lane);
      reduce_token<Element>(p, token, static_cast<int>(item % rsegments), srcs, aligned, lane);
    }
  }
}

template <int32_t kPart, bool kWire>
__global__ void __launch_bounds__(kBlockThreads, 1) combine_small_kernel(const CombineParams p) {
  __shared__ int32_t counts[kMaxWorldSize];
  __shared__ uint32_t timed_out;
  __shared__ int32_t failed;
  wait_for_prior_grid();
  allow_dependent_launch();
  switch (p.ctx.shape.combine_dtype) {
    case kCombineBf16:
      combine_small<typename SelectPartials<Bf16Element, kWire>::type, kPart>(p, counts, &timed_out, &failed);
      break;
    case kCombineFp16:
      combine_small<typename SelectPartials<Fp16Element, kWire>::type, kPart>(p, counts, &timed_out, &failed);
      break;
    default:
      combine_small<typename SelectPartials<Fp32Element, kWire>::type, kPart>(p, counts, &timed_out, &failed);
      break;
  }
}

// The push kernel of a call: small-batch or not, its part, and whether the
// partials are FP8 wire rows.
template <bool kWire>
void (*push_kernel(const CombineLaunch& args))(CombineParams) {
  switch (args.part) {
    case kPartSend:
      return args.small_batch != 0 ? combine_small_kernel<kPartSend, kWire> : combine_kernel<kPartSend, kWire>;
    case kPartReceive:
      return args.small_batch != 0 ? combine_small_kernel<kPartReceive, kWire> : combine_kernel<kPartReceive, kWire>;
    default:
      return args.small_batch != 0 ? combine_small_kernel<kPartFused, kWire> : combine_kernel<kPartFused, kWire>;
  }
}

}  // namespace

int32_t combine_phases(const GroupShape& shape, int32_t requested) {
  // A few large phases: each costs every push block a system fence, which
  // waits for the block's stores in flight over a loaded NVLink.  At most one
  // per row of max_tokens_per_rank (the counters' region).
  int32_t phases = requested > 0 ? requested : kDefaultCombinePhases;
  if (phases > shape.max_tokens_per_rank) phases = shape.max_tokens_per_rank;
  return phases < 1 ? 1 : phases;
}

int32_t combine_phase_rows(int32_t tokens_per_rank, int32_t phases) {
  const int64_t rows = (static_cast<int64_t>(tokens_per_rank) + phases - 1) / phases;
  return rows < 1 ? 1 : static_cast<int32_t>(rows);
}

int32_t resolve_combine_schedule(int32_t requested, int32_t world_size, int32_t tokens_per_rank,
                                 int32_t group_min_sm_budget) {
  if (requested == kCombineSerial || requested == kCombineOverlapped) return requested;
  // Overlap pays when there are many rows and enough blocks to push at NVLink
  // speed with part of them; small calls are latency-bound, and a small SM
  // budget leaves too few blocks to reduce.  Only group-wide values decide:
  // every rank must run the same schedule in a call.
  return world_size > 1 && group_min_sm_budget >= kOverlapMinBlocks && tokens_per_rank >= kOverlapMinTokens
             ? kCombineOverlapped
             : kCombineSerial;
}

int32_t combine_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank, int32_t sm_budget) {
  // The rows to push are only known on the device (up to tokens_per_rank per
  // peer), so size the grid for the larger of both jobs: a block per row.
  (void)shape;
  int64_t blocks = num_tokens > tokens_per_rank ? num_tokens : tokens_per_rank;
  if (blocks > sm_budget) blocks = sm_budget;
  return blocks < 1 ? 1 : static_cast<int32_t>(blocks);
}

int32_t combine_pull_blocks(int32_t num_tokens, int32_t sm_budget) {
  const int32_t blocks = num_tokens < sm_budget ? num_tokens : sm_budget;
  return blocks < 1 ? 1 : blocks;
}

cudaError_t launch_combine(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                           const CombineLaunch& args, cudaStream_t stream) {
  CombineParams p;
  p.ctx.shape = shape;
  p.ctx.offsets = offsets;
  p.ctx.state = state;
  p.args = args;
  p.phases = combine_phases(shape, args.phases);
  p.chunk_rows = combine_phase_rows(args.tokens_per_rank, p.phases);
  // The FP8 combine wire always pushes (the host never pulls wire rows).
  if (shape.combine_wire != 0 && args.pull != 0) return cudaErrorInvalidValue;
  if (args.pull != 0) return launch_combine_pull(p, stream);
  // The host's path selection chose the small-batch kernel only for a serial
  // schedule of at most kSmallCombineMaxTokens tokens per rank.
  void (*kernel)(CombineParams) = shape.combine_wire != 0 ? push_kernel<true>(args) : push_kernel<false>(args);
  return launch_kernel(kernel, args.num_blocks, kBlockThreads, 0, stream, args.pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
