// The expansion of a rank-major receive into expert rows
// (expert_layout_kernels.h), in two launches:
//  1. rank: each warp takes one warp tile of kExpertTileRows rank-major rows
//     and walks them in order, giving each local pick its place among the
//     tile's pairs of its expert (a warp match per 32 / top_k rows; the
//     warp's counters per expert in shared memory, or in its tile_counts row
//     when E_local is too large for shared memory).  Each block then scans
//     its warps' counts (a block tile), and the last block to finish scans the block tiles'
//     totals and places the experts (counts, offsets, dropped pairs) exactly
//     as the HOST backend does.  A pick's place in its expert is then its
//     block tile's first place + its warp tile's + its rank.
//  2. fill: a warp per segment of a rank-major row (kExpertSegmentBytes, so
//     that a small batch spreads over every SM) places the row's kept picks
//     (first place + rank < count) and copies the segment to each of them,
//     reading it once; the warp of the first segment also writes their
//     sources and weights, lists them in combine's order (token_rows) and
//     copies the scales; the other threads' grid-stride pass marks every row
//     that holds no pair as padding.
// So a pair's row is (source rank, source token, pick) order inside its
// expert without a sort, and the only serial step is the scan over tiles.
#include <stdint.h>

#include <cub/block/block_scan.cuh>

#include "common/kernel_launch.cuh"
#include "expert_layout_kernels.h"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {
namespace {

constexpr int kWarps = kBlockThreads / 32;
static_assert(kWarps == kExpertTileWarps, "a block tile is one block's warps");
// Per-warp counters in shared memory up to this many local experts (48 KiB,
// the default dynamic shared memory limit, for kWarps warps).
constexpr int kSharedCounterExperts = 48 * 1024 / (kWarps * 4);
constexpr uint32_t kFullMask = 0xFFFFFFFFu;

struct ExpandParams {
  ExpertLayoutShape shape;
  RankMajorReceive in;
  ExpertRowsBuffers rows;
};

__device__ __forceinline__ int64_t receive_rows(const ExpandParams& p) {
  return static_cast<int64_t>(p.shape.world_size) * p.in.tokens_per_rank;
}

// Whether rank-major row i holds a received token (its slot is below its
// source's count), with the counts in shared memory.
__device__ __forceinline__ bool row_received(const ExpandParams& p, const int32_t* counts, int64_t i) {
  const int64_t tpr = p.in.tokens_per_rank;
  const int s = static_cast<int>(i / tpr);
  return i - s * tpr < counts[s];
}

__device__ __forceinline__ int32_t local_expert(const ExpertLayoutShape& s, int32_t id) {
  const uint32_t e = static_cast<uint32_t>(id - s.first_expert);
  return id >= s.first_expert && e < static_cast<uint32_t>(s.experts_per_rank) ? static_cast<int32_t>(e) : -1;
}

__device__ void load_counts(const ExpandParams& p, int32_t* counts) {
  for (int s = threadIdx.x; s < p.shape.world_size; s += blockDim.x) counts[s] = __ldg(p.in.recv_counts + s);
  __syncthreads();
}

// ---- 1. rank ----

// Pick k of row i, of local expert e (-1: not local, or past top_k): its rank
// among the tile's earlier pairs of its expert, and the warp's counter.
__device__ __forceinline__ void rank_pick(const ExpandParams& p, int64_t i, int k, int32_t e, int32_t* counter,
                                          int lane) {
  // Lanes of one expert match each other; the others match only other non-local lanes.
  const uint32_t peers = __match_any_sync(kFullMask, e);
  int32_t base = 0;
  if (e >= 0) {
    base = counter[e];
    p.rows.pick_ranks[i * p.shape.top_k + k] = base + __popc(peers & ((1u << lane) - 1u));
  }
  __syncwarp();
  if (e >= 0 && lane == __ffs(peers) - 1) counter[e] = base + __popc(peers);
  __syncwarp();
}

// One warp, one tile: every local pick's rank among the tile's earlier
// pairs of its expert, and the tile's pairs per expert in `counter`
// (E_local entries, private to the warp).  With top_k <= 32 a step takes
// 32 / top_k rows at once, lane = (row in the step) * top_k + pick, so that
// the lanes below a lane are exactly its earlier pairs, and the ids of
// kRankSteps steps are loaded before they are ranked: one row and one load
// at a time leaves the walk bound by latencies.
constexpr int kRankSteps = kExpertTileRows;  // a whole tile even at top_k > 16

__device__ void rank_tile(const ExpandParams& p, const int32_t* recv_counts, int64_t tile, int32_t* counter, int lane) {
  const ExpertLayoutShape& s = p.shape;
  const int K = s.top_k, E = s.experts_per_rank;
  for (int e = lane; e < E; e += 32) counter[e] = 0;
  __syncwarp();
  const int64_t first = tile * kExpertTileRows;
  const int64_t end = first + kExpertTileRows < receive_rows(p) ? first + kExpertTileRows : receive_rows(p);
  if (K <= 32) {
    const int step_rows = 32 / K, row = lane / K, k = lane % K;
    for (int64_t g = first; g < end; g += int64_t{step_rows} * kRankSteps) {
      int32_t e[kRankSteps];
#pragma unroll
      for (int u = 0; u < kRankSteps; ++u) {
        const int64_t i = g + int64_t{u} * step_rows + row;
        const bool here = row < step_rows && i < end && row_received(p, recv_counts, i);
        e[u] = here ? local_expert(s, __ldg(p.in.ids + i * K + k)) : -1;
      }
#pragma unroll
      for (int u = 0; u < kRankSteps; ++u) {
        if (g + int64_t{u} * step_rows >= end) break;  // warp-uniform
        rank_pick(p, g + int64_t{u} * step_rows + row, k, e[u], counter, lane);
      }
    }
    return;
  }
  for (int64_t i = first; i < end; ++i) {
    if (!row_received(p, recv_counts, i)) continue;  // warp-uniform
    for (int c = 0; c < K; c += 32) {
      const int k = c + lane;
      rank_pick(p, i, k, k < K ? local_expert(s, __ldg(p.in.ids + i * K + k)) : -1, counter, lane);
    }
  }
}

// The last block, step 1: each block tile's totals become its first place
// per expert, and the pair totals go to `counts` (which step 2 overwrites).
// Each expert's block tiles are cut into up to kBlockThreads / E_local
// ranges, summed at once, so that the serial part is short at any world size.
__device__ void scan_block_tiles(const ExpandParams& p, int32_t* block_counts, int64_t block_tiles) {
  __shared__ int32_t partial[kBlockThreads];
  const int E = p.shape.experts_per_rank, threads = static_cast<int>(blockDim.x);
  int64_t parts = E >= threads ? 1 : threads / E;
  if (parts > block_tiles) parts = block_tiles < 1 ? 1 : block_tiles;
  const int items = static_cast<int>(E * parts);  // <= threads when parts > 1
  auto range = [&](int part, int64_t* t0, int64_t* t1) {
    *t0 = block_tiles * part / parts;
    *t1 = block_tiles * (part + 1) / parts;
  };
  if (parts > 1) {
    for (int x = threadIdx.x; x < items; x += threads) {
      int64_t t0, t1;
      range(x / E, &t0, &t1);
      int32_t sum = 0;
      for (int64_t t = t0; t < t1; ++t) sum += __ldcg(block_counts + t * E + x % E);
      partial[x] = sum;
    }
    __syncthreads();
  }
  for (int x = threadIdx.x; x < items; x += threads) {
    const int e = x % E, part = x / E;
    int32_t running = 0;
    for (int q = 0; q < part; ++q) running += partial[q * E + e];
    int64_t t0, t1;
    range(part, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) {
      int32_t* at = block_counts + t * E + e;
      const int32_t c = __ldcg(at);
      __stcg(at, running);
      running += c;
    }
    if (part == parts - 1) p.rows.counts[e] = running;
  }
  __syncthreads();
}

// The last block, step 2: the experts placed as the HOST backend places them.
// EXPERT_PACKED with a row bound: expert e starts at min(S_e, rows), S_e the
// sum of the aligned pair counts before it (once one expert reaches the
// bound, every later one starts there and keeps nothing), which one block
// scan gives.
__device__ void place_experts(const ExpandParams& p) {
  using Scan = cub::BlockScan<int64_t, kBlockThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ unsigned long long dropped;
  const ExpertLayoutShape& s = p.shape;
  const int E = s.experts_per_rank;
  if (threadIdx.x == 0) dropped = 0;
  __syncthreads();
  int64_t carry = 0;  // the same in every thread (the scans' aggregates)
  for (int first = 0; first < E; first += kBlockThreads) {
    const int e = first + static_cast<int>(threadIdx.x);
    const int64_t received = e < E ? p.rows.counts[e] : 0;  // the pair totals, from step 1
    const int64_t aligned = s.packed ? (received + s.alignment - 1) / s.alignment * s.alignment : 0;
    int64_t before = 0, total = 0;
    Scan(scan).ExclusiveSum(aligned, before, total);
    if (e < E) {
      const int64_t start = s.packed ? (carry + before < s.rows ? carry + before : s.rows) : int64_t{e} * s.capacity;
      const int64_t room = s.packed ? s.rows - start : s.capacity;
      const int64_t count = received < room ? received : room;
      p.rows.offsets[e] = static_cast<int32_t>(start);
      p.rows.counts[e] = static_cast<int32_t>(count);
      if (received > count) atomicAdd(&dropped, static_cast<unsigned long long>(received - count));
    }
    carry += total;
    __syncthreads();  // the scan's storage is reused
  }
  if (threadIdx.x == 0) {
    p.rows.offsets[E] = s.packed ? static_cast<int32_t>(carry < s.rows ? carry : s.rows) : s.rows;
    p.rows.dropped[0] = static_cast<int32_t>(dropped < INT32_MAX ? dropped : INT32_MAX);
  }
}

__global__ void __launch_bounds__(kBlockThreads, 1) expert_rank_kernel(const ExpandParams p) {
  extern __shared__ int32_t counters[];  // [kWarps][E_local] when E_local <= kSharedCounterExperts
  __shared__ int32_t recv_counts[kMaxWorldSize];
  __shared__ uint32_t last;
  wait_for_prior_grid();
  allow_dependent_launch();
  load_counts(p, recv_counts);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, E = p.shape.experts_per_rank;
  const bool shared_counters = E <= kSharedCounterExperts;
  const int64_t receive = receive_rows(p), warp_tiles = expert_layout_warp_tiles(receive);
  const int64_t block_tiles = expert_layout_block_tiles(receive);
  int32_t* block_counts = p.rows.tile_counts + warp_tiles * E;
  for (int64_t b = blockIdx.x; b < block_tiles; b += gridDim.x) {
    const int64_t t = b * kWarps + warp;
    if (t < warp_tiles) {
      rank_tile(p, recv_counts, t, shared_counters ? counters + warp * E : p.rows.tile_counts + t * E, lane);
    }
    __syncthreads();
    // The block tile's scan: each warp tile's first place inside it, and its totals.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      int32_t running = 0;
      for (int w = 0; w < kWarps && b * kWarps + w < warp_tiles; ++w) {
        int32_t* own = p.rows.tile_counts + (b * kWarps + w) * E + e;
        const int32_t c = shared_counters ? counters[w * E + e] : *own;
        *own = running;
        running += c;
      }
      block_counts[b * E + e] = running;
    }
    __syncthreads();  // the counters are reused by the next block tile
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(p.rows.ticket, 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (last == 0) return;
  __threadfence();
  scan_block_tiles(p, block_counts, block_tiles);
  place_experts(p);
  if (threadIdx.x == 0) *p.rows.ticket = 0;  // every block has counted in
}

// ---- 2. fill ----

// One rank-major row's picks [c, c + 32) as lane c + lane sees it.
struct Pick {
  int32_t expert;  // local expert, -1 if not local or past top_k
  int32_t row;     // its expert row, -1 if not kept
};

__device__ __forceinline__ Pick pick_of(const ExpandParams& p, int64_t i, int k) {
  const ExpertLayoutShape& s = p.shape;
  Pick q{-1, -1};
  if (k >= s.top_k) return q;
  q.expert = local_expert(s, __ldg(p.in.ids + i * s.top_k + k));
  if (q.expert < 0) return q;
  const int64_t E = s.experts_per_rank, warp_tiles = expert_layout_warp_tiles(receive_rows(p));
  const int64_t warp_tile = i / kExpertTileRows, block_tile = i / (kExpertTileRows * kWarps);
  const int32_t place = __ldg(p.rows.tile_counts + (warp_tiles + block_tile) * E + q.expert) +
                        __ldg(p.rows.tile_counts + warp_tile * E + q.expert) +
                        __ldg(p.rows.pick_ranks + i * s.top_k + k);
  if (place < __ldg(p.rows.counts + q.expert)) q.row = __ldg(p.rows.offsets + q.expert) + place;
  return q;
}

// Where pick k of row i goes in combine's order: the kept picks of the row
// before it in ascending (local expert, pick) order.
__device__ int32_t combine_position(const ExpandParams& p, int64_t i, int k, const Pick& mine) {
  const int K = p.shape.top_k;
  int32_t before = 0;
  if (K <= 32) {
    for (int q = 0; q < K; ++q) {
      const int32_t e = __shfl_sync(kFullMask, mine.expert, q);
      const int32_t row = __shfl_sync(kFullMask, mine.row, q);
      before += row >= 0 && (e < mine.expert || (e == mine.expert && q < k)) ? 1 : 0;
    }
    return before;
  }
  for (int q = 0; q < K; ++q) {
    const Pick other = pick_of(p, i, q);
    before += other.row >= 0 && (other.expert < mine.expert || (other.expert == mine.expert && q < k)) ? 1 : 0;
  }
  return before;
}

// Copies bytes [first, end) of the row at `src` to the same bytes of each of
// the `n` rows in `dst_rows` (row indices into `base`, `row_bytes` apart),
// reading the source once.
__device__ void copy_to_rows(const char* src, char* base, int64_t row_bytes, int64_t first, int64_t end,
                             const int32_t* dst_rows, int n, int lane) {
  if (first % 16 == 0 && end % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(base) % 16 == 0 && row_bytes % 16 == 0) {
    // kUnroll loads in flight per lane before the stores: one at a time
    // leaves the HBM latency-bound.
    constexpr int kUnroll = 4;
    const int64_t vectors = end / 16;
    const uint4* from = reinterpret_cast<const uint4*>(src);
    for (int64_t v0 = first / 16 + lane; v0 < vectors; v0 += 32 * kUnroll) {
      uint4 x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (v0 + u * 32 < vectors) x[u] = __ldg(from + v0 + u * 32);
      }
      for (int j = 0; j < n; ++j) {
        uint4* to = reinterpret_cast<uint4*>(base + dst_rows[j] * row_bytes);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          if (v0 + u * 32 < vectors) to[v0 + u * 32] = x[u];
        }
      }
    }
    return;
  }
  for (int64_t b = first + lane; b < end; b += 32) {
    const char x = src[b];
    for (int j = 0; j < n; ++j) base[dst_rows[j] * row_bytes + b] = x;
  }
}

// The scales of row i to kept pick rows, column-major: element j of a row in
// column j (EXPERT_MAJOR: of its expert's block of columns).
__device__ void copy_scale_columns(const ExpandParams& p, int64_t i, const int32_t* dst_rows,
                                   const int32_t* dst_experts, int n, int lane) {
  const ExpertLayoutShape& s = p.shape;
  const float* src = reinterpret_cast<const float*>(static_cast<const char*>(p.in.scales) + i * s.scale_row_bytes);
  float* columns = static_cast<float*>(p.rows.scales);
  const int64_t column =
      s.packed ? (static_cast<int64_t>(s.rows) + 3) / 4 * 4 : (static_cast<int64_t>(s.capacity) + 3) / 4 * 4;
  for (int j = 0; j < n; ++j) {
    const int64_t base = s.packed ? 0 : static_cast<int64_t>(dst_experts[j]) * s.scale_row_elems * column;
    const int64_t at = s.packed ? dst_rows[j] : dst_rows[j] - static_cast<int64_t>(dst_experts[j]) * s.capacity;
    for (int x = lane; x < s.scale_row_elems; x += 32) columns[base + x * column + at] = __ldg(src + x);
  }
}

// One warp, one segment of a received row: the segment's payload bytes to
// each kept pick's row; with the first segment, also the kept picks'
// metadata, their combine order and the row's scales.
__device__ void fill_segment(const ExpandParams& p, int64_t i, int64_t segment, int32_t* rows_list,
                             int32_t* experts_list, int lane) {
  const ExpertLayoutShape& s = p.shape;
  const int K = s.top_k;
  const bool first_segment = segment == 0;
  const int64_t first = segment * kExpertSegmentBytes;
  const int64_t end = first + kExpertSegmentBytes < s.hidden_row_bytes ? first + kExpertSegmentBytes : s.hidden_row_bytes;
  const int32_t source = static_cast<int32_t>(i / p.in.tokens_per_rank);
  const int32_t token = first_segment ? __ldg(p.in.source_tokens + i) : 0;
  int32_t kept_total = 0;
  for (int c = 0; c < K; c += 32) {
    const int k = c + lane;
    const Pick mine = pick_of(p, i, k);
    const uint32_t kept = __ballot_sync(kFullMask, mine.row >= 0);
    if (first_segment) {
      const int32_t position = combine_position(p, i, k, mine);
      if (mine.row >= 0) {
        p.rows.token_rows[i * K + position] = mine.row;
        int32_t* src = p.rows.sources + static_cast<int64_t>(mine.row) * 3;
        src[0] = source;
        src[1] = token;
        src[2] = k;
        p.rows.weights[mine.row] = p.in.weights ? __ldg(p.in.weights + i * K + k) : 1.0f;
      }
    }
    if (mine.row >= 0) {
      const int slot = __popc(kept & ((1u << lane) - 1u));
      rows_list[slot] = mine.row;
      experts_list[slot] = mine.expert;
    }
    __syncwarp();
    const int n = __popc(kept);
    copy_to_rows(static_cast<const char*>(p.in.hidden) + i * s.hidden_row_bytes, static_cast<char*>(p.rows.hidden),
                 s.hidden_row_bytes, first, end, rows_list, n, lane);
    if (first_segment && s.scale_row_elems > 0 && p.in.scales != nullptr) {
      if (s.scale_columns) {
        copy_scale_columns(p, i, rows_list, experts_list, n, lane);
      } else {
        copy_to_rows(static_cast<const char*>(p.in.scales) + i * s.scale_row_bytes, static_cast<char*>(p.rows.scales),
                     s.scale_row_bytes, 0, s.scale_row_bytes, rows_list, n, lane);
      }
    }
    kept_total += n;
    __syncwarp();  // the lists are rewritten by the next chunk
  }
  if (first_segment && lane == 0 && kept_total < K) p.rows.token_rows[i * K + kept_total] = -1;
}

// Whether expert row r holds a pair.
__device__ __forceinline__ bool holds_pair(const ExpandParams& p, int64_t r) {
  const ExpertLayoutShape& s = p.shape;
  if (!s.packed) {
    const int64_t e = r / s.capacity;
    return r - e * s.capacity < __ldg(p.rows.counts + e);
  }
  // The last expert whose first row is at or before r (an expert that shares
  // its offset with the next one holds nothing).
  int lo = 0, hi = s.experts_per_rank - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (__ldg(p.rows.offsets + mid) <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t start = __ldg(p.rows.offsets + lo);
  return r >= start && r < start + __ldg(p.rows.counts + lo);
}

__global__ void __launch_bounds__(kBlockThreads, 1) expert_fill_kernel(const ExpandParams p) {
  __shared__ int32_t recv_counts[kMaxWorldSize];
  __shared__ int32_t rows_list[kWarps][32];
  __shared__ int32_t experts_list[kWarps][32];
  wait_for_prior_grid();
  allow_dependent_launch();
  load_counts(p, recv_counts);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t segments = expert_layout_segments(p.shape.hidden_row_bytes), end = receive_rows(p) * segments;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp; item < end;
       item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = item / segments;
    if (row_received(p, recv_counts, i)) fill_segment(p, i, item - i * segments, rows_list[warp], experts_list[warp], lane);
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < p.shape.rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (holds_pair(p, r)) continue;
    int32_t* src = p.rows.sources + r * 3;
    src[0] = -1;
    src[1] = -1;
    src[2] = -1;
    p.rows.weights[r] = 0.0f;
  }
}

int32_t blocks_for(int64_t items_per_block_round, int64_t items, int32_t max_blocks) {
  const int64_t wanted = (items + items_per_block_round - 1) / items_per_block_round;
  const int64_t cap = max_blocks < 1 ? 1 : max_blocks;
  return static_cast<int32_t>(wanted < 1 ? 1 : wanted < cap ? wanted : cap);
}

}  // namespace

cudaError_t launch_expand_to_expert_rows(const ExpertLayoutShape& shape, const RankMajorReceive& in,
                                         const ExpertRowsBuffers& rows, int32_t max_blocks, int32_t pdl,
                                         cudaStream_t stream) {
  if (shape.world_size < 1 || shape.world_size > kMaxWorldSize || in.tokens_per_rank < 0 ||
      in.tokens_per_rank > shape.max_tokens_per_rank || shape.experts_per_rank < 1 || shape.top_k < 1 ||
      (shape.packed ? shape.alignment < 1 : shape.capacity < 1)) {
    return cudaErrorInvalidValue;
  }
  const ExpandParams p{shape, in, rows};
  const int64_t receive = static_cast<int64_t>(shape.world_size) * in.tokens_per_rank;
  const int32_t rank_blocks = blocks_for(1, expert_layout_block_tiles(receive), max_blocks);
  const size_t shared = shape.experts_per_rank <= kSharedCounterExperts
                            ? static_cast<size_t>(kWarps) * shape.experts_per_rank * sizeof(int32_t)
                            : 0;  // the warps count in their tile_counts rows instead
  cudaError_t e = launch_kernel(expert_rank_kernel, rank_blocks, kBlockThreads, shared, stream, pdl, p);
  if (e != cudaSuccess) return e;
  // A warp per segment of a received row, and a thread per expert row for the padding.
  const int64_t segments = receive * expert_layout_segments(shape.hidden_row_bytes);
  const int64_t fill_items = segments > shape.rows / 32 ? segments : shape.rows / 32;
  const int32_t fill_blocks = blocks_for(kWarps, fill_items, max_blocks);
  return launch_kernel(expert_fill_kernel, fill_blocks, kBlockThreads, 0, stream, pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
