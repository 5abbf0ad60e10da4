// Dispatch of the NCCL backend, around NCCL's grouped send/recv:
//   route   one launch, one block per chunk of kNcclRouteChunk tokens: which
//           ranks each token goes to, its slot among the chunk's tokens bound
//           there, rows per chunk and rank; counts valid picks per expert and
//           records bad ids (as the HOST backend reports them).  The last
//           block to finish (a counter) scans the chunk rows into exclusive
//           prefixes (ascending source order across chunks), rows per
//           destination and the header of every destination (this rank's own
//           straight into its receive block), then clears the histogram and
//           the counter for the next call;
//   pack    warp per token, for the slots of one row range (all of
//           [0, tokens_per_rank) unless dispatch is pipelined): the token's
//           final slots (chunk prefix + slot in the chunk, kept for combine),
//           then the row into the destination's send segment and the
//           rewritten ids, the weights, the token's index (expert layouts)
//           and the scales into its metadata block
//           (or, for this rank, all into the result rows); padding rows of ids
//           and weights (invalid id, 0) for the range's rows past each
//           destination's count;
//   finish  after NCCL: checks each received header against this rank's
//           tokens_per_rank (a bad one is dropped and reported, never used
//           as an index), then recv_counts, local_expert_counts, EPLB rows
//           (block 0), and every block moves the received ids, weights,
//           token indices and scales from the metadata blocks into the
//           result rows.
#include <stdint.h>

#include "common/fast_division.h"
#include "common/kernel_common.cuh"
#include "common/row_copy.cuh"
#include "nccl_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

__device__ __forceinline__ bool valid_expert(const NcclShape& s, int32_t id) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(s.num_experts);
}

__device__ __forceinline__ int owner(const NcclShape& s, int32_t id) {
  return static_cast<int>(divide_by_magic(static_cast<uint32_t>(id), s.owner_magic, s.owner_shift));
}

// Experts up to this count are counted in shared memory first (one global
// atomic per expert and block instead of one per pick).
constexpr int kSharedHistogram = 4096;

// Picks of a token loaded together before any is counted: their loads are in
// flight at once instead of one after another behind the counting atomics.
constexpr int kPicksAtOnce = 16;

// Ranks owning a valid pick of the token; counts the picks into `hist`,
// records bad ids.  A pick of a rank in `masked` is dropped, as if invalid.
__device__ uint64_t route_token(const NcclShape& s, const NcclBuffers& b, const int32_t* ids, int32_t token,
                                uint64_t masked, int32_t* hist) {
  uint64_t mask = 0;
  const int32_t* row = ids + static_cast<int64_t>(token) * s.top_k;
  for (int first = 0; first < s.top_k; first += kPicksAtOnce) {
    int32_t picked[kPicksAtOnce];
#pragma unroll
    for (int i = 0; i < kPicksAtOnce; ++i) picked[i] = first + i < s.top_k ? __ldg(row + first + i) : 0;
#pragma unroll
    for (int i = 0; i < kPicksAtOnce; ++i) {
      if (first + i >= s.top_k) break;
      const int32_t id = picked[i];
      if (valid_expert(s, id)) {
        const uint64_t bit = uint64_t{1} << owner(s, id);
        if ((masked & bit) == 0) {
          mask |= bit;
          atomicAdd(hist + id, 1);
        }
      } else if (id != s.invalid_expert_id) {
        atomicAdd(&b.errors->bad_id_count, 1u);
        const uint64_t position = static_cast<uint64_t>(token) * s.top_k + first + i;
        atomicMin(reinterpret_cast<unsigned long long*>(&b.errors->bad_id_first),
                  static_cast<unsigned long long>((position << 32) | static_cast<uint32_t>(id)));
      }
    }
  }
  return mask;
}

// This rank's send segment for destination d.
__device__ __forceinline__ char* send_segment(const NcclShape& s, const NcclBuffers& b, int d) {
  return b.send_segments + d * nccl_send_segment_stride(s);
}

// Where this rank's metadata block for destination d goes (d == rank: its own
// receive block in recv_meta, which only ever holds the header).
__device__ __forceinline__ char* meta_for(const NcclShape& s, const NcclBuffers& b, int d, int64_t tpr) {
  return d == s.rank ? b.recv_meta + d * nccl_meta_stride(s) : send_segment(s, b, d) + nccl_send_meta_offset(s, tpr);
}

// Route chunks whose rows the scan loads together.
constexpr int kChunksAtOnce = 8;

// The last block of the route kernel, once every block's counts are visible:
// chunk rows -> exclusive prefix per destination, rows per destination, and
// the header of every destination; then the histogram and the counter are
// cleared for the next call (stream order makes that visible to it).
__device__ void scan_and_write_headers(const NcclShape& s, const NcclBuffers& b, const NcclDispatchLaunch& a,
                                       int chunks) {
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) {
    int32_t running = 0;
    // kChunksAtOnce chunks' rows loaded before any prefix is stored (the
    // stores could alias the loads for all the compiler knows).
    for (int first = 0; first < chunks; first += kChunksAtOnce) {
      int32_t rows[kChunksAtOnce];
#pragma unroll
      for (int i = 0; i < kChunksAtOnce; ++i) {
        rows[i] = first + i < chunks ? __ldcg(b.chunk_offsets + static_cast<int64_t>(first + i) * s.world_size + d) : 0;
      }
#pragma unroll
      for (int i = 0; i < kChunksAtOnce; ++i) {
        if (first + i >= chunks) break;
        b.chunk_offsets[static_cast<int64_t>(first + i) * s.world_size + d] = running;
        running += rows[i];
      }
    }
    b.dest_rows[d] = running;
    int32_t* h = reinterpret_cast<int32_t*>(meta_for(s, b, d, a.tokens_per_rank));
    h[0] = kNcclHeaderTag;
    h[1] = a.tokens_per_rank;
    h[2] = running;
  }
  const int epr = s.experts_per_rank;
  for (int i = threadIdx.x; i < s.world_size * epr; i += blockDim.x) {
    const int d = i / epr, e = i % epr;
    reinterpret_cast<int32_t*>(meta_for(s, b, d, a.tokens_per_rank))[kNcclHeaderFixed + e] =
        __ldcg(b.expert_hist + d * epr + e);
  }
  if (s.eplb_enabled) {
    for (int i = threadIdx.x; i < s.world_size * s.num_experts; i += blockDim.x) {
      const int d = i / s.num_experts, x = i % s.num_experts;
      const int32_t v = a.eplb_local ? __ldg(a.eplb_local + x) : __ldcg(b.expert_hist + x);
      reinterpret_cast<int32_t*>(meta_for(s, b, d, a.tokens_per_rank))[kNcclHeaderFixed + epr + x] = v;
    }
  }
  __syncthreads();  // every read of the histogram above comes before it is cleared
  for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) b.expert_hist[e] = 0;
  if (threadIdx.x == 0) *b.route_done = 0u;
}

__global__ void __launch_bounds__(kBlockThreads) route_kernel(NcclShape s, NcclBuffers b, NcclDispatchLaunch a) {
  __shared__ uint32_t warp_counts[kWarpsPerBlock][kMaxWorldSize];
  __shared__ int32_t shared_hist[kSharedHistogram];
  __shared__ bool last_block;
  const bool shared = s.num_experts <= kSharedHistogram;
  if (shared) {
    for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) shared_hist[e] = 0;
    __syncthreads();
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t t = blockIdx.x * kNcclRouteChunk + static_cast<int32_t>(threadIdx.x);
  const bool here = t < a.num_tokens;
  const uint64_t masked = __ldcg(b.masked_ranks);  // written between calls: no stale cached copy
  const uint64_t mask = here ? route_token(s, b, a.topk_ids, t, masked, shared ? shared_hist : b.expert_hist) : 0;
  for (int d = 0; d < s.world_size; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) warp_counts[warp][d] = __popc(ballot);
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
  // The token's slot in the chunk: the warp's offset plus its position among
  // the warp's tokens bound to d (the same ballots again); -1 where not sent.
  const uint32_t below = (1u << lane) - 1u;
  for (int d = 0; d < s.world_size; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (here) {
      b.local_slots[static_cast<int64_t>(t) * s.world_size + d] =
          ((mask >> d) & 1u) ? static_cast<int32_t>(warp_counts[warp][d] + __popc(ballot & below)) : -1;
    }
  }
  // The last block to get here scans: every thread's stores made visible at
  // device scope before one thread counts the block in.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(b.route_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  scan_and_write_headers(s, b, a, static_cast<int>(gridDim.x));
}

// Row `slot` of destination d's segment: the row in the send buffer and the
// ids, weights and scales in the metadata block, or (d == rank) all in the results.
struct SegmentRow {
  char* hidden;
  char* scales;
  int32_t* ids;
  float* weights;
};

__device__ __forceinline__ SegmentRow segment_row(const NcclShape& s, const NcclBuffers& b, int tpr, int d,
                                                  int32_t slot) {
  const int64_t row = static_cast<int64_t>(d) * tpr + slot;
  SegmentRow r;
  if (d == s.rank) {
    r.hidden = b.recv_hidden + row * s.hidden_row_bytes;
    r.scales = s.scale_row_bytes ? b.recv_scales + row * s.scale_row_bytes : nullptr;
    r.ids = b.recv_ids + row * s.top_k;
    r.weights = b.recv_weights + row * s.top_k;
    return r;
  }
  char* meta = meta_for(s, b, d, tpr);
  r.hidden = send_segment(s, b, d) + nccl_send_rows_offset(s) + static_cast<int64_t>(slot) * s.hidden_row_bytes;
  r.scales = s.scale_row_bytes ? meta + nccl_meta_scales_offset(s, tpr) + slot * s.scale_row_bytes : nullptr;
  r.ids = reinterpret_cast<int32_t*>(meta + nccl_meta_ids_offset(s)) + static_cast<int64_t>(slot) * s.top_k;
  r.weights = reinterpret_cast<float*>(meta + nccl_meta_weights_offset(s, tpr)) + static_cast<int64_t>(slot) * s.top_k;
  return r;
}

// Where the row of `r` (slot `slot` of destination d's segment) keeps its
// source token index (source_tokens only): in the metadata block, just after
// the block's weights (nccl_meta_tokens_offset), or (d == rank) in the
// results.  Derived from r.weights: the pack kernel has no registers to spare.
__device__ __forceinline__ int32_t* segment_token(const NcclShape& s, const NcclBuffers& b, const SegmentRow& r,
                                                  int tpr, int d, int32_t slot) {
  if (d == s.rank) return b.recv_tokens + static_cast<int64_t>(d) * tpr + slot;
  return reinterpret_cast<int32_t*>(r.weights + static_cast<int64_t>(tpr - slot) * s.top_k) + slot;
}

__device__ __forceinline__ bool packs(int32_t rows, int d, int rank) {
  return rows == kPackAll || ((rows == kPackOwn) == (d == rank));
}

// The token's final slots (its chunk's prefix plus its slot in the chunk),
// read by a warp; the entries of the destinations this launch packs are
// stored for combine (two launches packing disjoint destinations may run at once).
__device__ __forceinline__ TokenDestinations final_slots(const NcclShape& s, const NcclBuffers& b, int32_t t,
                                                         int32_t which, int lane) {
  const int64_t row = static_cast<int64_t>(t) * s.world_size;
  const int64_t chunk = static_cast<int64_t>(t / kNcclRouteChunk) * s.world_size;
  TokenDestinations dests;
  int32_t slot[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int d = lane + 32 * half;
    slot[half] = -1;
    if (d < s.world_size) {
      const int32_t local = b.local_slots[row + d];
      slot[half] = local >= 0 ? local + b.chunk_offsets[chunk + d] : -1;
      if (packs(which, d, s.rank)) b.token_slots[row + d] = slot[half];
    }
  }
  dests.slot_low = slot[0];
  dests.slot_high = slot[1];
  dests.mask = static_cast<uint64_t>(__ballot_sync(0xFFFFFFFFu, slot[0] >= 0)) |
               (static_cast<uint64_t>(__ballot_sync(0xFFFFFFFFu, slot[1] >= 0)) << 32);
  return dests;
}

// Packs the rows of slots [slot_begin, slot_end) of every segment `which`
// selects.  A token's slot on any rank is at most its index (rows keep
// ascending source order), so tokens below slot_begin have nothing there and
// are not visited (a pipelined dispatch's first range, from 0, stores every
// token's slots); the others skip the destinations whose slot lies outside.
// kTokens (s.source_tokens) also stores each row's token index: a template
// argument, so that the rank-major kernel spends no register on it.
template <bool kTokens>
__global__ void __launch_bounds__(kBlockThreads) pack_kernel(NcclShape s, NcclBuffers b, NcclDispatchLaunch a,
                                                             int32_t which, int32_t slot_begin, int32_t slot_end) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int first_warp = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const int tpr = a.tokens_per_rank;
  for (int32_t t = slot_begin + first_warp; t < a.num_tokens; t += warps) {
    const TokenDestinations dests = final_slots(s, b, t, which, lane);
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
        if (kTokens && k == 0) *segment_token(s, b, r, tpr, d, slot) = t;
      }
    }
  }
  // Padding rows of the range in every segment: ids invalid, weights 0 (their
  // token indices are never read: the expansion reads received rows only).
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

// The metadata block received from src (src == rank: this rank's own header).
__device__ __forceinline__ const char* received_meta(const NcclShape& s, const NcclBuffers& b, int src, int64_t tpr) {
  const int64_t at = nccl_recv_meta_offset(s, src, tpr);
  return at == -1 ? b.recv_meta + src * nccl_meta_stride(s) : b.recv_hidden + at;
}
__device__ __forceinline__ const int32_t* received_header(const NcclShape& s, const NcclBuffers& b, int src,
                                                          int64_t tpr) {
  return reinterpret_cast<const int32_t*>(received_meta(s, b, src, tpr));
}

__device__ __forceinline__ bool header_fits(const int32_t* h, int32_t tpr) {
  return h[0] == kNcclHeaderTag && h[1] == tpr && h[2] >= 0 && h[2] <= tpr;
}

// Block 0: counts, errors, expert counts, EPLB rows.
__device__ void finish_counts(const NcclShape& s, const NcclBuffers& b, int32_t tpr, const int32_t* valid_rows) {
  for (int src = threadIdx.x; src < s.world_size; src += blockDim.x) {
    b.recv_counts[src] = valid_rows[src] >= 0 ? valid_rows[src] : 0;
  }
  if (threadIdx.x == 0) {  // the lowest rejected rank is reported; the record keeps the first call's
    for (int src = 0; src < s.world_size; ++src) {
      if (valid_rows[src] >= 0) continue;
      if (b.errors->bad_peer_count++ == 0u) {
        b.errors->bad_peer_first = src;
        b.errors->bad_peer_tpr = received_header(s, b, src, tpr)[1];
        b.errors->bad_peer_rows = received_header(s, b, src, tpr)[2];
      }
    }
  }
  for (int e = threadIdx.x; e < s.experts_per_rank; e += blockDim.x) {
    int32_t sum = 0;
    for (int src = 0; src < s.world_size; ++src) {
      if (valid_rows[src] >= 0) sum += received_header(s, b, src, tpr)[kNcclHeaderFixed + e];
    }
    b.local_expert_counts[e] = sum;
  }
  if (s.eplb_enabled) {
    for (int i = threadIdx.x; i < s.world_size * s.num_experts; i += blockDim.x) {
      const int src = i / s.num_experts, x = i % s.num_experts;
      b.eplb_gathered[i] =
          valid_rows[src] >= 0 ? received_header(s, b, src, tpr)[kNcclHeaderFixed + s.experts_per_rank + x] : 0;
    }
  }
}

// Grid-stride copy of `bytes` bytes (4-byte units where both ends allow).
__device__ void grid_copy(char* dst, const char* src, int64_t bytes, int64_t thread, int64_t threads) {
  const uintptr_t ends = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  if (((ends | static_cast<uintptr_t>(bytes)) & 3) == 0) {
    for (int64_t i = thread; i < bytes / 4; i += threads) {
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
    }
  } else {
    for (int64_t i = thread; i < bytes; i += threads) dst[i] = src[i];
  }
}

__global__ void __launch_bounds__(kBlockThreads) finish_kernel(NcclShape s, NcclBuffers b, int32_t tpr) {
  __shared__ int32_t valid_rows[kMaxWorldSize];
  for (int src = threadIdx.x; src < s.world_size; src += blockDim.x) {
    const int32_t* h = received_header(s, b, src, tpr);
    valid_rows[src] = header_fits(h, tpr) ? h[2] : -1;
  }
  __syncthreads();
  if (blockIdx.x == 0) finish_counts(s, b, tpr, valid_rows);
  // Every peer's ids, weights and scales into the result rows; a rejected
  // segment becomes all padding: nothing in it may look like a token.
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t picks = static_cast<int64_t>(tpr) * s.top_k;
  for (int src = 0; src < s.world_size; ++src) {
    if (src == s.rank) continue;  // packed straight into the results
    const char* meta = received_meta(s, b, src, tpr);
    const int32_t* ids = reinterpret_cast<const int32_t*>(meta + nccl_meta_ids_offset(s));
    const float* weights = reinterpret_cast<const float*>(meta + nccl_meta_weights_offset(s, tpr));
    int32_t* out_ids = b.recv_ids + src * picks;
    float* out_weights = b.recv_weights + src * picks;
    const bool valid = valid_rows[src] >= 0;
    for (int64_t i = thread; i < picks; i += threads) {
      out_ids[i] = valid ? ids[i] : s.invalid_expert_id;
      out_weights[i] = valid ? weights[i] : 0.0f;
    }
    if (s.source_tokens) {
      const int32_t* tokens = reinterpret_cast<const int32_t*>(meta + nccl_meta_tokens_offset(s, tpr));
      int32_t* out_tokens = b.recv_tokens + static_cast<int64_t>(src) * tpr;
      for (int64_t i = thread; i < tpr; i += threads) out_tokens[i] = valid ? tokens[i] : -1;
    }
    if (valid && s.scale_row_bytes) {
      grid_copy(b.recv_scales + src * tpr * s.scale_row_bytes, meta + nccl_meta_scales_offset(s, tpr),
                tpr * s.scale_row_bytes, thread, threads);
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

cudaError_t launch_nccl_dispatch_route(const NcclShape& shape, const NcclBuffers& buffers,
                                       const NcclDispatchLaunch& args, cudaStream_t stream) {
  // At least one block: the last block writes the headers even when no token is here.
  const int32_t chunks = blocks_for(args.num_tokens, kNcclRouteChunk, 0);
  route_kernel<<<chunks, kBlockThreads, 0, stream>>>(shape, buffers, args);
  return cudaGetLastError();
}

cudaError_t launch_nccl_dispatch_pack(const NcclShape& shape, const NcclBuffers& buffers,
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
  if (shape.source_tokens) {
    pack_kernel<true><<<blocks, kBlockThreads, 0, stream>>>(shape, buffers, args, rows, slot_begin, slot_end);
  } else {
    pack_kernel<false><<<blocks, kBlockThreads, 0, stream>>>(shape, buffers, args, rows, slot_begin, slot_end);
  }
  return cudaGetLastError();
}

cudaError_t launch_nccl_dispatch_finish(const NcclShape& shape, const NcclBuffers& buffers, int32_t tokens_per_rank,
                                        int32_t max_blocks, cudaStream_t stream) {
  // The received metadata of every peer: about one entry per thread (each
  // thread's loads wait behind its previous stores).
  const int64_t entries = static_cast<int64_t>(shape.world_size - 1) * tokens_per_rank *
                          (shape.top_k + (shape.source_tokens ? 1 : 0) + (shape.scale_row_bytes + 3) / 4);
  const int32_t blocks = blocks_for(entries, kBlockThreads, max_blocks);
  finish_kernel<<<blocks, kBlockThreads, 0, stream>>>(shape, buffers, tokens_per_rank);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace moe_ep
