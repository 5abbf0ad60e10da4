// Combine: one kernel per call, with two kinds of blocks working at once.
//   push blocks: every row this rank received from a peer s (rows s*tpr + j,
//     j < recv_count[s]) goes back to s's combine_in region (segment of this
//     rank, row j), in chunks of chunk_rows rows taken in ascending order; a
//     chunk is published with one release store of the epoch to its flag;
//   reduce blocks: each local token sums its partials over ranks in ascending
//     rank order, in fp32 starting from 0.0f exactly as the HOST backend does,
//     as soon as the chunks holding its rows have landed, so the reduction
//     overlaps the NVLink traffic instead of following it.
// Block 0 also tells every peer at once that this combine has started: a rank
// finishes its combine only after every peer's "started" flag, which is what
// lets the next dispatch reuse the single receive region (docs/nvlink_backend.md).
#include <stdint.h>

#include "device_sync.cuh"
#include "float_convert.cuh"
#include "kernel_common.cuh"
#include "moe_ep_kernels.h"
#include "row_copy.cuh"

namespace moe_ep {
namespace kernels {
namespace {

struct CombineParams {
  KernelContext ctx;
  CombineLaunch args;
  int32_t chunk_rows;  // rows per chunk flag, combine_chunk_rows()
};

// The reduce moves 32 lanes x 4 vectors per step and source (2 KiB).
constexpr int kReduceVectorsPerLane = 4;
constexpr int kReduceSegmentBytes = 32 * kReduceVectorsPerLane * 16;

__device__ __forceinline__ bool combine_rows_aligned(const CombineParams& p) {
  return p.ctx.shape.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.expert_output) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.args.output) % 16 == 0;
}

__device__ __forceinline__ int combine_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_row_bytes + kSegmentBytes - 1) / kSegmentBytes) : 1;
}

__device__ __forceinline__ int reduce_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_row_bytes + kReduceSegmentBytes - 1) / kReduceSegmentBytes)
                 : 1;
}

// How the grid splits into push blocks [0, push) and reduce blocks
// [grid - reduce, grid); a grid of one block does both, pushes first.
struct Roles {
  int push;
  int reduce;
  __device__ Roles(int world, int grid) {
    if (world == 1) {
      push = 0;
      reduce = grid;
    } else if (grid == 1) {
      push = 1;
      reduce = 1;
    } else {
      reduce = grid / 3 > 1 ? grid / 3 : 1;
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
  const int64_t row_bytes = s.combine_row_bytes;
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

// One chunk: rows [first, last) received from `peer`, pushed back to it.
__device__ void push_chunk(const CombineParams& p, int peer, int64_t first, int64_t last, bool aligned) {
  const int segments = combine_segments(p, aligned);
  const int64_t items = (last - first) * segments;
  for (int64_t item = threadIdx.x / 32; item < items; item += kWarpsPerBlock) {
    push_row_segment(p, peer, first + item / segments, static_cast<int>(item % segments), aligned);
  }
}

// Push role.  Chunks are numbered chunk-major over the peers (chunk 0 of every
// peer, then chunk 1, ...) and dealt round-robin to the push blocks, so they
// land roughly in ascending order, the order in which the peers reduce.
__device__ void push_rows(const CombineParams& p, const int32_t* counts, int push_blocks, bool aligned,
                          uint64_t epoch) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int64_t chunk_rows = p.chunk_rows;
  int64_t most = 0;
  for (int r = 0; r < s.world_size; ++r) most = r != s.rank && counts[r] > most ? counts[r] : most;
  const int64_t max_chunks = (most + chunk_rows - 1) / chunk_rows;
  int64_t index = 0;
  for (int64_t chunk = 0; chunk < max_chunks; ++chunk) {
    for (int peer = 0; peer < s.world_size; ++peer) {
      const int64_t first = chunk * chunk_rows;
      if (peer == s.rank || first >= counts[peer]) continue;
      if (index++ % push_blocks != blockIdx.x) continue;
      const int64_t last = first + chunk_rows < counts[peer] ? first + chunk_rows : counts[peer];
      push_chunk(p, peer, first, last, aligned);
      __syncthreads();
      if (threadIdx.x == 0) {
        fence_acq_rel_sys();
        uint64_t* flag = c.remote<uint64_t>(peer, c.offsets.combine_chunk_flags) +
                         static_cast<int64_t>(s.rank) * s.max_tokens_per_rank + chunk;
        store_release_sys(flag, epoch);
      }
    }
  }
}

// Where the partial of local token `token` from rank q lives (q's slot known).
__device__ __forceinline__ const char* partial_row(const CombineParams& p, int q, int32_t slot) {
  const KernelContext& c = p.ctx;
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row_bytes = c.shape.combine_row_bytes;
  if (q == c.shape.rank) {
    return static_cast<const char*>(p.args.expert_output) + (c.shape.rank * tpr + slot) * row_bytes;
  }
  return c.state.local_base + c.offsets.combine_in + (c.combine_segment(q, c.shape.rank) * tpr + slot) * row_bytes;
}

// One 2 KiB segment of an output row, 16-byte vectors.
template <typename Element>
__device__ __forceinline__ void accumulate(float (&acc)[kReduceVectorsPerLane][16 / sizeof(typename Element::Bits)],
                                           const uint4 (&v)[kReduceVectorsPerLane]) {
  using Bits = typename Element::Bits;
#pragma unroll
  for (int u = 0; u < kReduceVectorsPerLane; ++u) {
    const Bits* b = reinterpret_cast<const Bits*>(&v[u]);
#pragma unroll
    for (int e = 0; e < static_cast<int>(16 / sizeof(Bits)); ++e) acc[u][e] += Element::load(b[e]);
  }
}

// One 2 KiB segment of an output row, 16-byte vectors.  The partials are
// loaded two ranks at a time before either is added (more bytes in flight per
// warp), and added strictly in ascending rank order.
template <typename Element>
__device__ void reduce_segment(const CombineParams& p, int32_t token, int segment, const TokenDestinations& srcs,
                               int lane) {
  using Bits = typename Element::Bits;
  constexpr int kPerVector = 16 / sizeof(Bits);
  const int64_t row_bytes = p.ctx.shape.combine_row_bytes;
  const int64_t offset = static_cast<int64_t>(segment) * kReduceSegmentBytes;
  const int vectors =
      static_cast<int>((row_bytes - offset < kReduceSegmentBytes ? row_bytes - offset : kReduceSegmentBytes) / 16);
  float acc[kReduceVectorsPerLane][kPerVector];
#pragma unroll
  for (int u = 0; u < kReduceVectorsPerLane; ++u) {
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) acc[u][e] = 0.0f;
  }
  uint64_t rest = srcs.mask;  // ascending rank order
  while (rest != 0) {
    const int q0 = lowest_rank(rest);
    rest &= rest - 1;
    const int q1 = rest != 0 ? lowest_rank(rest) : -1;
    if (q1 >= 0) rest &= rest - 1;
    const uint4* a = reinterpret_cast<const uint4*>(partial_row(p, q0, srcs.slot(q0)) + offset);
    const int32_t slot1 = srcs.slot(q1 >= 0 ? q1 : q0);
    const uint4* b = q1 >= 0 ? reinterpret_cast<const uint4*>(partial_row(p, q1, slot1) + offset) : nullptr;
    uint4 va[kReduceVectorsPerLane] = {}, vb[kReduceVectorsPerLane] = {};
#pragma unroll
    for (int u = 0; u < kReduceVectorsPerLane; ++u) {
      if (u * 32 + lane < vectors) {
        va[u] = __ldcg(a + u * 32 + lane);
        if (b) vb[u] = __ldcg(b + u * 32 + lane);
      }
    }
    accumulate<Element>(acc, va);
    if (b) accumulate<Element>(acc, vb);
  }
  uint4* dst = reinterpret_cast<uint4*>(static_cast<char*>(p.args.output) + token * row_bytes + offset);
#pragma unroll
  for (int u = 0; u < kReduceVectorsPerLane; ++u) {
    if (u * 32 + lane >= vectors) continue;
    uint4 out;
    Bits* o = reinterpret_cast<Bits*>(&out);
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) o[e] = Element::store(acc[u][e]);
    dst[u * 32 + lane] = out;
  }
}

// Rows of any size or alignment: element by element.
template <typename Element>
__device__ void reduce_row_any(const CombineParams& p, int32_t token, const TokenDestinations& srcs, int lane) {
  using Bits = typename Element::Bits;
  const int H = p.ctx.shape.hidden_size;
  Bits* dst = reinterpret_cast<Bits*>(static_cast<char*>(p.args.output) + token * p.ctx.shape.combine_row_bytes);
  for (int h0 = 0; h0 < H; h0 += 32) {  // warp-uniform trip count: slot() shuffles need every lane
    const int h = h0 + lane;
    float acc = 0.0f;
    for (uint64_t rest = srcs.mask; rest != 0; rest &= rest - 1) {
      const int q = lowest_rank(rest);
      const Bits* src = reinterpret_cast<const Bits*>(partial_row(p, q, srcs.slot(q)));
      if (h < H) acc += Element::load(__ldcg(src + h));
    }
    if (h < H) dst[h] = Element::store(acc);
  }
}

// Lane q waits for the chunk holding this token's row from rank q (and lane
// q for rank q + 32).  Chunks seen landed are remembered per lane: a warp's
// tokens ascend, so the chunk it needs from a rank never goes back.
__device__ __forceinline__ bool wait_one_partial(const CombineParams& p, int q, int32_t slot, int64_t* ready, uint64_t epoch) {
  const KernelContext& c = p.ctx;
  if (q >= c.shape.world_size || q == c.shape.rank || slot < 0) return true;
  const int64_t chunk = slot / p.chunk_rows;
  if (chunk == *ready) return true;
  const uint64_t* flag = c.local<uint64_t>(c.offsets.combine_chunk_flags) +
                         static_cast<int64_t>(q) * c.shape.max_tokens_per_rank + chunk;
  if (!wait_until_at_least(flag, epoch, c.control(), c.state.mirror, c.state.timeout_ns, kPhaseCombine, q)) {
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
    if (aligned) {
      reduce_segment<Element>(p, token, static_cast<int>(item % segments), srcs, lane);
    } else {
      reduce_row_any<Element>(p, token, srcs, lane);
    }
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

template <typename Element>
__device__ void combine_serial(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  const KernelContext& c = p.ctx;
  push_rows_interleaved(p, counts, aligned);
  publish_block_arrival(c, c.offsets.combine_arrivals);
  __shared__ int32_t failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  for (int q = threadIdx.x; q < c.shape.world_size; q += blockDim.x) {
    if (q == c.shape.rank) continue;
    if (!wait_until_at_least(c.local<uint64_t>(c.offsets.combine_arrivals) + q, epoch * kArrivalsPerCall,
                             c.control(), c.state.mirror, c.state.timeout_ns, kPhaseCombine, q)) {
      failed = 1;
    }
  }
  __syncthreads();
  if (failed) return;
  reduce_tokens<Element>(p, Roles(1, gridDim.x), aligned, epoch, false);
}

template <typename Element>
__device__ void combine_overlapped(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  if (blockIdx.x == 0) {  // nothing to order before it: a plain release store
    for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
      if (q != s.rank) store_release_sys(c.remote<uint64_t>(q, c.offsets.combine_started) + s.rank, epoch);
    }
  }
  const Roles roles(s.world_size, gridDim.x);
  if (static_cast<int>(blockIdx.x) < roles.push) push_rows(p, counts, roles.push, aligned, epoch);
  if (static_cast<int>(blockIdx.x) >= static_cast<int>(gridDim.x) - roles.reduce) {
    reduce_tokens<Element>(p, roles, aligned, epoch, true);
  }
  if (blockIdx.x == gridDim.x - 1) wait_for_peers_started(p, epoch);
}

template <typename Element>
__device__ void combine_body(const CombineParams& p, const int32_t* counts, bool aligned, uint64_t epoch) {
  if (p.args.schedule == kCombineOverlapped) {
    combine_overlapped<Element>(p, counts, aligned, epoch);
  } else {
    combine_serial<Element>(p, counts, aligned, epoch);
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) combine_kernel(const CombineParams p) {
  __shared__ int32_t counts[kMaxWorldSize];
  __shared__ uint32_t timed_out;
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  ControlBlock* control = c.control();
  // Independent loads first, all in flight at once: the timeout record, the
  // epoch and the row counts.
  if (threadIdx.x == 0) timed_out = *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase);
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch);
  const volatile int32_t* counts_private = c.local<int32_t>(c.offsets.counts_private);
  const int32_t my_count = static_cast<int>(threadIdx.x) < s.world_size ? counts_private[threadIdx.x] : 0;
  if (static_cast<int>(threadIdx.x) < s.world_size) counts[threadIdx.x] = my_count;
  __syncthreads();
  if (timed_out != kPhaseNone) return;  // block-uniform
  const bool aligned = combine_rows_aligned(p);
  switch (s.combine_dtype) {
    case kCombineBf16: combine_body<Bf16Element>(p, counts, aligned, epoch); break;
    case kCombineFp16: combine_body<Fp16Element>(p, counts, aligned, epoch); break;
    default: combine_body<Fp32Element>(p, counts, aligned, epoch); break;
  }
}

}  // namespace

int32_t combine_chunk_rows(const GroupShape& shape, int32_t tokens_per_rank) {
  // About 64 KiB per chunk at large batches (a flag per chunk costs a fence),
  // single rows at small ones (more chunks in flight, earlier reductions).
  int64_t rows = 65536 / (shape.combine_row_bytes > 0 ? shape.combine_row_bytes : 1);
  const int64_t by_batch = tokens_per_rank / 256;
  if (rows > by_batch) rows = by_batch;
  if (rows > 1024) rows = 1024;
  return rows < 1 ? 1 : static_cast<int32_t>(rows);
}

int32_t combine_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank, int32_t sm_budget) {
  // The rows to push are only known on the device (up to tokens_per_rank per
  // peer), so size the grid for the larger of both jobs: a block per row.
  (void)shape;
  int64_t blocks = num_tokens > tokens_per_rank ? num_tokens : tokens_per_rank;
  if (blocks > sm_budget) blocks = sm_budget;
  return blocks < 1 ? 1 : static_cast<int32_t>(blocks);
}

cudaError_t launch_combine(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                           const CombineLaunch& args, cudaStream_t stream) {
  CombineParams p;
  p.ctx.shape = shape;
  p.ctx.offsets = offsets;
  p.ctx.state = state;
  p.args = args;
  p.chunk_rows = combine_chunk_rows(shape, args.tokens_per_rank);
  combine_kernel<<<args.num_blocks, kBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace moe_ep
