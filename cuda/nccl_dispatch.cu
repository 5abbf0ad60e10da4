// Dispatch of the NCCL backend, around NCCL's grouped send/recv:
//   route   one block per chunk of kNcclRouteChunk tokens: which ranks each
//           token goes to, its slot among the chunk's tokens bound there,
//           rows per chunk and rank; counts valid picks per expert and
//           records bad ids (as the HOST backend reports them);
//   scan    one block: chunk rows -> exclusive prefix (ascending source
//           order across chunks), rows per destination, and the header of
//           every destination (this rank's own straight into recv_header);
//   pack    warp per token, for the slots of one row range (all of
//           [0, tokens_per_rank) unless dispatch is pipelined): the row,
//           the rewritten ids, the weights and the scales into the
//           destination's send segment (or, for this rank, into the result
//           rows); padding rows of ids and weights (invalid id, 0) for the
//           range's rows past each destination's count;
//   finish  after NCCL: checks each received header against this rank's
//           tokens_per_rank (a bad one is dropped and reported, never used
//           as an index), then recv_counts, local_expert_counts, EPLB rows.
#include <stdint.h>

#include "fast_division.h"
#include "kernel_common.cuh"
#include "nccl_kernels.h"
#include "row_copy.cuh"

namespace moe_ep {
namespace kernels {
namespace {

__device__ __forceinline__ bool valid_expert(const GroupShape& s, int32_t id) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(s.num_experts);
}

__device__ __forceinline__ int owner(const GroupShape& s, int32_t id) {
  return static_cast<int>(divide_by_magic(static_cast<uint32_t>(id), s.owner_magic, s.owner_shift));
}

// Experts up to this count are counted in shared memory first (one global
// atomic per expert and block instead of one per pick).
constexpr int kSharedHistogram = 4096;

// Ranks owning a valid pick of the token; counts the picks into `hist`, records bad ids.
__device__ uint64_t route_token(const GroupShape& s, const NcclBuffers& b, const int32_t* ids, int32_t token,
                                int32_t* hist) {
  uint64_t mask = 0;
  const int32_t* row = ids + static_cast<int64_t>(token) * s.top_k;
  for (int k = 0; k < s.top_k; ++k) {
    const int32_t id = __ldg(row + k);
    if (valid_expert(s, id)) {
      mask |= uint64_t{1} << owner(s, id);
      atomicAdd(hist + id, 1);
    } else if (id != s.invalid_expert_id) {
      atomicAdd(&b.errors->bad_id_count, 1u);
      const uint64_t position = static_cast<uint64_t>(token) * s.top_k + k;
      atomicMin(reinterpret_cast<unsigned long long*>(&b.errors->bad_id_first),
                static_cast<unsigned long long>((position << 32) | static_cast<uint32_t>(id)));
    }
  }
  return mask;
}

__global__ void __launch_bounds__(kBlockThreads) route_kernel(GroupShape s, NcclBuffers b, NcclDispatchLaunch a) {
  __shared__ uint32_t warp_counts[kWarpsPerBlock][kMaxWorldSize];
  __shared__ int32_t shared_hist[kSharedHistogram];
  const bool shared = s.num_experts <= kSharedHistogram;
  if (shared) {
    for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) shared_hist[e] = 0;
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t t = blockIdx.x * kNcclRouteChunk + static_cast<int32_t>(threadIdx.x);
  const bool here = t < a.num_tokens;
  const uint64_t mask = here ? route_token(s, b, a.topk_ids, t, shared ? shared_hist : b.expert_hist) : 0;
  const uint32_t below = (1u << lane) - 1u;
  for (int d = 0; d < s.world_size; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) warp_counts[warp][d] = __popc(ballot);
    // The token's position among the warp's tokens bound to d; the warp's offset is added below.
    const uint32_t position = __popc(ballot & below);
    if (here && ((mask >> d) & 1u)) {
      b.token_slots[static_cast<int64_t>(t) * s.world_size + d] = static_cast<int32_t>(position);
    }
  }
  __syncthreads();
  if (shared) {
    for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) {
      if (shared_hist[e] != 0) atomicAdd(b.expert_hist + e, shared_hist[e]);
    }
  }
  // Warp offsets inside the chunk, and the chunk's rows per destination.
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) {
    uint32_t running = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      const uint32_t c = warp_counts[w][d];
      warp_counts[w][d] = running;
      running += c;
    }
    b.chunk_offsets[static_cast<int64_t>(blockIdx.x) * s.world_size + d] = static_cast<int32_t>(running);
  }
  __syncthreads();
  if (!here) return;
  int32_t* slots = b.token_slots + static_cast<int64_t>(t) * s.world_size;
  for (int d = 0; d < s.world_size; ++d) {
    // The position written above (same thread) plus the warp's offset; -1 where not sent.
    slots[d] = ((mask >> d) & 1u) ? slots[d] + static_cast<int32_t>(warp_counts[warp][d]) : -1;
  }
}

// Final slots: the chunk's prefix (after scan) plus the slot inside the chunk;
// kept for combine.  Before any pack, so that two packs can run at once.
__global__ void __launch_bounds__(kBlockThreads) slots_kernel(GroupShape s, NcclBuffers b, NcclDispatchLaunch a) {
  const int64_t n = static_cast<int64_t>(a.num_tokens) * s.world_size;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t t = static_cast<int32_t>(i / s.world_size);
    const int d = static_cast<int>(i % s.world_size);
    if (b.token_slots[i] >= 0) b.token_slots[i] += b.chunk_offsets[static_cast<int64_t>(t / kNcclRouteChunk) * s.world_size + d];
  }
}

// Where this rank's header for destination d goes.
__device__ __forceinline__ int32_t* header_for(const GroupShape& s, const NcclBuffers& b, int d) {
  const int64_t H = nccl_header_ints(s);
  return d == s.rank ? b.recv_header + s.rank * H : b.send_header + d * H;
}

__global__ void __launch_bounds__(kBlockThreads) scan_kernel(GroupShape s, NcclBuffers b, NcclDispatchLaunch a) {
  const int chunks = (a.num_tokens + kNcclRouteChunk - 1) / kNcclRouteChunk;
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) {
    int32_t running = 0;
    for (int c = 0; c < chunks; ++c) {
      int32_t* at = b.chunk_offsets + static_cast<int64_t>(c) * s.world_size + d;
      const int32_t rows = *at;
      *at = running;
      running += rows;
    }
    b.dest_rows[d] = running;
    int32_t* h = header_for(s, b, d);
    h[0] = a.tokens_per_rank;
    h[1] = running;
  }
  const int epr = s.experts_per_rank;
  for (int i = threadIdx.x; i < s.world_size * epr; i += blockDim.x) {
    const int d = i / epr, e = i % epr;
    header_for(s, b, d)[kNcclHeaderFixed + e] = b.expert_hist[d * epr + e];
  }
  if (s.eplb_enabled) {
    for (int i = threadIdx.x; i < s.world_size * s.num_experts; i += blockDim.x) {
      const int d = i / s.num_experts, x = i % s.num_experts;
      const int32_t v = a.eplb_local ? __ldg(a.eplb_local + x) : b.expert_hist[x];
      header_for(s, b, d)[kNcclHeaderFixed + epr + x] = v;
    }
  }
}

// Row `slot` of destination d's segment, in the send buffer or (d == rank) in the results.
struct SegmentRow {
  char* hidden;
  char* scales;
  int32_t* ids;
  float* weights;
};

__device__ __forceinline__ SegmentRow segment_row(const GroupShape& s, const NcclBuffers& b, int tpr, int d,
                                                  int32_t slot) {
  const int64_t row = static_cast<int64_t>(d) * tpr + slot;
  const bool own = d == s.rank;
  SegmentRow r;
  r.hidden = (own ? b.recv_hidden : b.send_hidden) + row * s.hidden_row_bytes;
  r.scales = s.scale_row_bytes ? (own ? b.recv_scales : b.send_scales) + row * s.scale_row_bytes : nullptr;
  r.ids = (own ? b.recv_ids : b.send_ids) + row * s.top_k;
  r.weights = (own ? b.recv_weights : b.send_weights) + row * s.top_k;
  return r;
}

__device__ __forceinline__ bool packs(int32_t rows, int d, int rank) {
  return rows == kPackAll || ((rows == kPackOwn) == (d == rank));
}

// Packs the rows of slots [slot_begin, slot_end) of every segment `which`
// selects.  A token's slot on any rank is at most its index (rows keep
// ascending source order), so tokens below slot_begin have nothing there and
// are not visited; the others skip the destinations whose slot lies outside.
__global__ void __launch_bounds__(kBlockThreads) pack_kernel(GroupShape s, NcclBuffers b, NcclDispatchLaunch a,
                                                             int32_t which, int32_t slot_begin, int32_t slot_end) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int first_warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int tpr = a.tokens_per_rank;
  for (int32_t t = slot_begin + first_warp; t < a.num_tokens; t += warps) {
    const int32_t* slots = b.token_slots + static_cast<int64_t>(t) * s.world_size;
    const TokenDestinations dests = TokenDestinations::load(slots, s.world_size, lane);
    const char* src = static_cast<const char*>(a.hidden) + static_cast<int64_t>(t) * s.hidden_row_bytes;
    const char* src_scales =
        a.scales ? static_cast<const char*>(a.scales) + static_cast<int64_t>(t) * s.scale_row_bytes : nullptr;
    const int32_t* ids = a.topk_ids + static_cast<int64_t>(t) * s.top_k;
    const float* weights = a.topk_weights ? a.topk_weights + static_cast<int64_t>(t) * s.top_k : nullptr;
    for (uint64_t m = dests.mask; m != 0; m &= m - 1) {
      const int d = lowest_rank(m);
      if (!packs(which, d, s.rank)) continue;
      const int32_t slot = dests.slot(d);  // the same on every lane: the branches below are warp-uniform
      if (slot < slot_begin || slot >= slot_end) continue;
      const SegmentRow r = segment_row(s, b, tpr, d, slot);
      warp_copy_bytes(r.hidden, src, s.hidden_row_bytes, lane);
      if (src_scales) warp_copy_bytes(r.scales, src_scales, s.scale_row_bytes, lane);
      for (int k = lane; k < s.top_k; k += 32) {
        const int32_t id = __ldg(ids + k);
        r.ids[k] = valid_expert(s, id) && owner(s, id) == d ? id : s.invalid_expert_id;
        r.weights[k] = weights ? __ldg(weights + k) : 0.0f;
      }
    }
  }
  // Padding rows of the range in every segment: ids invalid, weights 0.
  const int64_t span = slot_end - slot_begin;
  const int64_t rows = static_cast<int64_t>(s.world_size) * span;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * s.top_k; i += threads) {
    const int64_t row = i / s.top_k;
    const int d = static_cast<int>(row / span);
    const int32_t slot = slot_begin + static_cast<int32_t>(row % span);
    if (slot < b.dest_rows[d] || !packs(which, d, s.rank)) continue;
    const SegmentRow r = segment_row(s, b, tpr, d, slot);
    const int k = static_cast<int>(i % s.top_k);
    r.ids[k] = s.invalid_expert_id;
    r.weights[k] = 0.0f;
  }
}

__global__ void __launch_bounds__(kBlockThreads) finish_kernel(GroupShape s, NcclBuffers b, int32_t tpr) {
  __shared__ int32_t valid_rows[kMaxWorldSize];
  const int64_t H = nccl_header_ints(s);
  for (int src = threadIdx.x; src < s.world_size; src += blockDim.x) {
    const int32_t* h = b.recv_header + src * H;
    const bool ok = h[0] == tpr && h[1] >= 0 && h[1] <= tpr;
    valid_rows[src] = ok ? h[1] : -1;
    b.recv_counts[src] = ok ? h[1] : 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // the lowest rejected rank is reported; the record keeps the first call's
    for (int src = 0; src < s.world_size; ++src) {
      if (valid_rows[src] >= 0) continue;
      if (b.errors->bad_peer_count++ == 0u) {
        b.errors->bad_peer_first = src;
        b.errors->bad_peer_tpr = b.recv_header[src * H];
        b.errors->bad_peer_rows = b.recv_header[src * H + 1];
      }
    }
  }
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x) {
    int32_t sum = 0;
    for (int src = 0; src < s.world_size; ++src) {
      if (valid_rows[src] >= 0) sum += b.recv_header[src * H + kNcclHeaderFixed + e];
    }
    b.local_expert_counts[e] = sum;
  }
  if (s.eplb_enabled) {
    for (int i = threadIdx.x; i < s.world_size * s.num_experts; i += blockDim.x) {
      const int src = i / s.num_experts, x = i % s.num_experts;
      b.eplb_gathered[i] = valid_rows[src] >= 0 ? b.recv_header[src * H + kNcclHeaderFixed + s.experts_per_rank + x] : 0;
    }
  }
  // A rejected segment becomes all padding: nothing in it may look like a token.
  for (int src = 0; src < s.world_size; ++src) {
    if (valid_rows[src] >= 0) continue;
    const int64_t first = static_cast<int64_t>(src) * tpr * s.top_k;
    for (int64_t i = threadIdx.x; i < static_cast<int64_t>(tpr) * s.top_k; i += blockDim.x) {
      b.recv_ids[first + i] = s.invalid_expert_id;
      b.recv_weights[first + i] = 0.0f;
    }
  }
}

int32_t blocks_for(int64_t work, int64_t per_block, int32_t max_blocks) {
  int64_t n = (work + per_block - 1) / per_block;
  if (n < 1) n = 1;
  if (max_blocks > 0 && n > max_blocks) n = max_blocks;
  return static_cast<int32_t>(n);
}

}  // namespace

cudaError_t launch_nccl_dispatch_route(const GroupShape& shape, const NcclBuffers& buffers,
                                       const NcclDispatchLaunch& args, cudaStream_t stream) {
  cudaError_t rc = cudaMemsetAsync(buffers.expert_hist, 0, sizeof(int32_t) * shape.num_experts, stream);
  if (rc != cudaSuccess) return rc;
  const int32_t chunks = (args.num_tokens + kNcclRouteChunk - 1) / kNcclRouteChunk;
  if (args.num_tokens > 0) {
    route_kernel<<<chunks, kBlockThreads, 0, stream>>>(shape, buffers, args);
    if ((rc = cudaGetLastError()) != cudaSuccess) return rc;
  }
  scan_kernel<<<1, kBlockThreads, 0, stream>>>(shape, buffers, args);
  if ((rc = cudaGetLastError()) != cudaSuccess) return rc;
  if (args.num_tokens > 0) {
    const int64_t entries = static_cast<int64_t>(args.num_tokens) * shape.world_size;
    slots_kernel<<<blocks_for(entries, kBlockThreads, args.max_blocks), kBlockThreads, 0, stream>>>(shape, buffers,
                                                                                                    args);
    rc = cudaGetLastError();
  }
  return rc;
}

cudaError_t launch_nccl_dispatch_pack(const GroupShape& shape, const NcclBuffers& buffers,
                                      const NcclDispatchLaunch& args, int32_t rows, int32_t slot_begin,
                                      int32_t slot_end, cudaStream_t stream) {
  if (slot_begin < 0 || slot_begin > slot_end || slot_end > args.tokens_per_rank) return cudaErrorInvalidValue;
  if (slot_begin == slot_end) return cudaSuccess;
  // A warp per token from slot_begin on; at least enough blocks to write the padding quickly.
  const int64_t tokens = args.num_tokens > slot_begin ? args.num_tokens - slot_begin : 0;
  const int64_t padding = static_cast<int64_t>(shape.world_size) * (slot_end - slot_begin) * shape.top_k;
  int32_t blocks = blocks_for(tokens, kWarpsPerBlock, args.max_blocks);
  const int32_t padding_blocks = blocks_for(padding, 4 * kBlockThreads, args.max_blocks);
  if (padding_blocks > blocks) blocks = padding_blocks;
  pack_kernel<<<blocks, kBlockThreads, 0, stream>>>(shape, buffers, args, rows, slot_begin, slot_end);
  return cudaGetLastError();
}

cudaError_t launch_nccl_dispatch_finish(const GroupShape& shape, const NcclBuffers& buffers,
                                        int32_t tokens_per_rank, cudaStream_t stream) {
  finish_kernel<<<1, kBlockThreads, 0, stream>>>(shape, buffers, tokens_per_rank);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace moe_ep
