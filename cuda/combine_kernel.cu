// Combine: one kernel per call.
//   1. push: every row this rank received from a peer s (rows s*tpr + j,
//      j < recv_count[s]) goes back to s's combine_in region, segment of this
//      rank, row j;
//   2. the last block to finish its pushes publishes one flag to every peer
//      (always, even with nothing sent: the flag also tells the peer that this
//      rank has issued this combine, see docs/nvlink_backend.md) and advances
//      the epoch;
//   3. every block waits for every peer's flag, then reduces: each local token
//      sums its partials over ranks in ascending rank order, in fp32 starting
//      from 0.0f, exactly as the HOST backend does, and stores the result.
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
};

__device__ __forceinline__ bool combine_rows_aligned(const CombineParams& p) {
  return p.ctx.shape.combine_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.expert_output) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.args.output) % 16 == 0;
}

__device__ __forceinline__ int combine_segments(const CombineParams& p, bool aligned) {
  return aligned ? static_cast<int>((p.ctx.shape.combine_row_bytes + kSegmentBytes - 1) / kSegmentBytes) : 1;
}

// Step 1.  Rows are numbered over the peers in rank order; every warp of the
// grid takes (row, segment) items in turn.
__device__ void push_rows(const CombineParams& p, const int32_t* counts, bool aligned) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int lane = threadIdx.x % 32;
  const int64_t tpr = p.args.tokens_per_rank;
  const int64_t row_bytes = s.combine_row_bytes;
  const int segments = combine_segments(p, aligned);
  int64_t rows = 0;
  for (int r = 0; r < s.world_size; ++r) rows += r == s.rank ? 0 : counts[r];
  const int64_t items = rows * segments;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += warps) {
    int64_t j = item / segments;
    const int segment = static_cast<int>(item % segments);
    int peer = 0;
    while (peer == s.rank || j >= counts[peer]) {
      if (peer != s.rank) j -= counts[peer];
      ++peer;
    }
    const char* src = static_cast<const char*>(p.args.expert_output) + (peer * tpr + j) * row_bytes;
    char* dst = c.rank_base(peer) + c.offsets.combine_in + (c.combine_segment(s.rank, peer) * tpr + j) * row_bytes;
    if (!aligned) {
      warp_copy_bytes(dst, src, row_bytes, lane);
      continue;
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

// Step 3, one 2 KiB segment of an output row, 16-byte vectors.
template <typename Element>
__device__ void reduce_segment(const CombineParams& p, int32_t token, int segment, const TokenDestinations& srcs,
                               int lane) {
  using Bits = typename Element::Bits;
  constexpr int kPerVector = 16 / sizeof(Bits);
  const int64_t row_bytes = p.ctx.shape.combine_row_bytes;
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  const int vectors = static_cast<int>((row_bytes - offset < kSegmentBytes ? row_bytes - offset : kSegmentBytes) / 16);
  float acc[kVectorsPerLane][kPerVector];
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) acc[u][e] = 0.0f;
  }
  for (uint64_t rest = srcs.mask; rest != 0; rest &= rest - 1) {  // ascending rank order
    const int q = lowest_rank(rest);
    const uint4* src = reinterpret_cast<const uint4*>(partial_row(p, q, srcs.slot(q)) + offset);
    uint4 v[kVectorsPerLane];
#pragma unroll
    for (int u = 0; u < kVectorsPerLane; ++u) {
      if (u * 32 + lane < vectors) v[u] = __ldcg(src + u * 32 + lane);
    }
#pragma unroll
    for (int u = 0; u < kVectorsPerLane; ++u) {
      const Bits* b = reinterpret_cast<const Bits*>(&v[u]);
#pragma unroll
      for (int e = 0; e < kPerVector; ++e) acc[u][e] += Element::load(b[e]);
    }
  }
  uint4* dst = reinterpret_cast<uint4*>(static_cast<char*>(p.args.output) + token * row_bytes + offset);
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane >= vectors) continue;
    uint4 out;
    Bits* b = reinterpret_cast<Bits*>(&out);
#pragma unroll
    for (int e = 0; e < kPerVector; ++e) b[e] = Element::store(acc[u][e]);
    dst[u * 32 + lane] = out;
  }
}

// Step 3 for rows of any size or alignment: element by element.
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

template <typename Element>
__device__ void reduce_tokens(const CombineParams& p, bool aligned) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int segments = combine_segments(p, aligned);
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += warps) {
    const int32_t token = static_cast<int32_t>(item / segments);
    const TokenDestinations srcs =
        TokenDestinations::load(slots + static_cast<int64_t>(token) * s.world_size, s.world_size, lane);
    if (aligned) {
      reduce_segment<Element>(p, token, static_cast<int>(item % segments), srcs, lane);
    } else {
      reduce_row_any<Element>(p, token, srcs, lane);
    }
  }
}

__global__ void __launch_bounds__(kBlockThreads, 2) combine_kernel(const CombineParams p) {
  __shared__ int32_t counts[kMaxWorldSize];
  __shared__ int32_t wait_failed;
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  ControlBlock* control = c.control();
  if (handle_timed_out(control)) return;
  const uint64_t epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch);
  const int32_t* counts_private = c.local<int32_t>(c.offsets.counts_private);
  for (int r = threadIdx.x; r < s.world_size; r += blockDim.x) counts[r] = counts_private[r];
  if (threadIdx.x == 0) wait_failed = 0;
  __syncthreads();

  const bool aligned = combine_rows_aligned(p);
  push_rows(p, counts, aligned);
  if (arrive_last(&control->combine_arrivals, gridDim.x)) {
    for (int peer = threadIdx.x; peer < s.world_size; peer += blockDim.x) {
      if (peer != s.rank) store_release_sys(&(c.remote<FlagSlot>(peer, c.offsets.combine_flags) + s.rank)->epoch, epoch);
    }
    if (threadIdx.x == 0) control->epoch = epoch + 1;  // every block read it before arriving
  }
  for (int peer = threadIdx.x; peer < s.world_size; peer += blockDim.x) {
    if (peer == s.rank) continue;
    if (!wait_for_flag(c.local<FlagSlot>(c.offsets.combine_flags) + peer, epoch, control, c.state.mirror,
                       c.state.timeout_ns, kPhaseCombine, peer)) {
      wait_failed = 1;
    }
  }
  __syncthreads();
  if (wait_failed) return;

  switch (s.combine_dtype) {
    case kCombineBf16: reduce_tokens<Bf16Element>(p, aligned); break;
    case kCombineFp16: reduce_tokens<Fp16Element>(p, aligned); break;
    default: reduce_tokens<Fp32Element>(p, aligned); break;
  }
}

}  // namespace

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
  combine_kernel<<<args.num_blocks, kBlockThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace moe_ep
