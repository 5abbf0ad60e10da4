// Dispatch: one kernel per call.  General kernel: every block
//   1. takes its logical index L from a ticket and routes only its own tokens
//      (share L, in order): their slots among themselves on every destination,
//      their picks into the rank's per-expert histogram, their bad ids;
//   2. publishes its count per destination and reads those of blocks
//      0 .. L - 1 (a decoupled look-back, dispatch_lookback.h): its tokens go
//      after theirs, so a token's slot on a destination is the number of
//      earlier local tokens bound there (ascending source order,
//      deterministic, no count exchange before the data); calls the host
//      routes by scan instead (DispatchLaunch::lookback 0: small calls, large
//      grids) skip the look-back: L is the block index, the block scans the
//      tokens up to its last itself, block G - 1 counts every pick;
//   3. writes its tokens' rows, rewritten ids, weights and scales straight into
//      the final receive rows of each destination (row = rank*tpr + slot), and
//      its padding rows (ids = invalid, weights = 0): one per own token that
//      does not go there, from the back, and its share of [T, tpr);
//   4. publishes with one release-add per destination (arrival counters).
// The last block (the last ticket, or after a scan the last index) knows the
// totals once it has looked back or scanned: it sends every rank its row
// count, its per-expert counts and this rank's EPLB row before its own
// release.  Block 0, last, waits for every
// rank's arrivals and produces recv_counts and local_expert_counts.  A block
// waits only for blocks that drew an earlier ticket, which are running and
// publish before they wait: no deadlock whatever the residency.
#include <stdint.h>
#ifdef MOE_EP_DIAGNOSTICS
#include <stdio.h>  // DispatchTrace prints
#endif

#include <atomic>

#include "bulk_store_ring.cuh"
#include "device_sync.cuh"
#include "dispatch_lookback.h"
#include "dispatch_token_shares.h"
#include "fast_division.h"
#include "kernel_common.cuh"
#include "kernel_launch.cuh"
#include "moe_ep_kernels.h"
#include "row_copy.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Experts up to this count are counted in shared memory, larger in global.
constexpr int kSharedHistogram = 4096;
// Routing rounds (of kBlockThreads tokens) whose ids are loaded before use.
constexpr int kRoundsPerPass = 4;

struct DispatchParams {
  KernelContext ctx;
  DispatchLaunch args;
};

struct RoutingShared {
  uint32_t warp_counts[kWarpsPerBlock][kMaxWorldSize];
  uint32_t warp_offsets[kWarpsPerBlock][kMaxWorldSize];
  uint32_t totals[kMaxWorldSize];       // tokens bound to each rank so far (general kernel: own tokens only)
  int32_t histogram[kSharedHistogram];  // valid picks per expert counted by this block (histogram_of)
  uint32_t timed_out;                   // the handle's timeout record at kernel start
  // General kernel only (the look-back):
  uint32_t before[kMaxWorldSize];    // tokens of blocks 0 .. L - 1 bound to each rank
  uint32_t all_rows[kMaxWorldSize];  // last block: the rows this rank sends each rank
  uint64_t epoch;                    // this call's number
  uint32_t tag;                      // this call's look-back tag
  int32_t logical;                   // L
};

// Measurement builds only (-DMOE_EP_DIAGNOSTICS, MOE_EP_DISPATCH_DIAGNOSTIC
// bit 4): per-block phase times, in both kernels.  Thread 0 of every block
// stamps the global timer (ns) at the marks below and stores its stamps before
// the block's publication; block 0, once every block of the rank has arrived,
// prints a line per block: "dtrace RANK EPOCH BLOCK", the stamps, and block
// 0's own publication, end of its waits and end (0 on other blocks), for
// scripts/gpu/dispatch_trace.py.  (Printing from every block perturbed the
// timing: the stamps are gathered instead.)  In other builds the class is
// empty and every call compiles to nothing.
#ifdef MOE_EP_DIAGNOSTICS
constexpr int kTraceRanks = 8, kTraceBlocks = 1024, kTraceMarks = 6;
__device__ uint64_t dispatch_trace_stamps[kTraceRanks][kTraceBlocks][kTraceMarks];
#endif

class DispatchTrace {
 public:
  enum Mark { kStart, kSetUp, kFirstRound, kRouted, kSent, kPadded, kMarks };

#ifdef MOE_EP_DIAGNOSTICS
  __device__ explicit DispatchTrace(const DispatchParams& p)
      : p_(p), on_((p.args.diagnostic & 4) != 0 && threadIdx.x == 0 && blockIdx.x < kTraceBlocks) {
    mark(kStart);
  }
  __device__ void mark(Mark m) {
    if (on_) stamps_[m] = global_timer_ns();
  }
  __device__ void store() const {
    if (!on_) return;
    for (int i = 0; i < kMarks; ++i) dispatch_trace_stamps[p_.ctx.shape.rank % kTraceRanks][blockIdx.x][i] = stamps_[i];
  }
  // Block 0 only, after the block's publication and after its waits.
  __device__ void mark_published() {
    if (on_) published_ = global_timer_ns();
  }
  __device__ void mark_waited() {
    if (on_) waited_ = global_timer_ns();
  }
  __device__ void print(uint64_t epoch) const {
    if (!on_ || blockIdx.x != 0) return;
    const unsigned long long done = global_timer_ns();
    const int rank = p_.ctx.shape.rank;
    for (int b = 0; b < static_cast<int>(gridDim.x) && b < kTraceBlocks; ++b) {
      const volatile uint64_t* t = dispatch_trace_stamps[rank % kTraceRanks][b];
      printf("dtrace %d %llu %d %llu %llu %llu %llu %llu %llu %llu %llu %llu\n", rank,
             static_cast<unsigned long long>(epoch), b, static_cast<unsigned long long>(t[0]),
             static_cast<unsigned long long>(t[1]), static_cast<unsigned long long>(t[2]),
             static_cast<unsigned long long>(t[3]), static_cast<unsigned long long>(t[4]),
             static_cast<unsigned long long>(t[5]), b == 0 ? static_cast<unsigned long long>(published_) : 0ull,
             b == 0 ? static_cast<unsigned long long>(waited_) : 0ull, b == 0 ? done : 0ull);
    }
  }

 private:
  static_assert(kMarks == kTraceMarks, "one stamp per mark");
  const DispatchParams& p_;
  const bool on_;
  uint64_t stamps_[kMarks] = {};
  uint64_t published_ = 0;
  uint64_t waited_ = 0;
#else
  __device__ explicit DispatchTrace(const DispatchParams&) {}
  __device__ void mark(Mark) {}
  __device__ void store() const {}
  __device__ void mark_published() {}
  __device__ void mark_waited() {}
  __device__ void print(uint64_t) const {}
#endif
};

__device__ __forceinline__ bool is_valid_expert(const GroupShape& s, int32_t id) {
  return static_cast<uint32_t>(id) < static_cast<uint32_t>(s.num_experts);
}

__device__ __forceinline__ int owner_of(const GroupShape& s, int32_t id) {
  return static_cast<int>(divide_by_magic(static_cast<uint32_t>(id), s.owner_magic, s.owner_shift));
}

// Adds the rank that owns pick `id` to `mask`; nothing for a masked or bad
// id.  (A branch: as a select, the general kernel's register path spilled
// 20 / 124 bytes against 4 / 4.)
__device__ __forceinline__ void add_owner(const GroupShape& s, int32_t id, uint64_t& mask) {
  if (is_valid_expert(s, id)) mask |= uint64_t{1} << owner_of(s, id);
}

// Ranks that own at least one valid pick of the token.  (Unrolled by 8, one
// load round for top-8, the general kernel's register path spilled 52 / 132
// bytes against 4 / 4.)
__device__ inline uint64_t token_mask(const GroupShape& s, const int32_t* ids_row) {
  uint64_t mask = 0;
#pragma unroll 4
  for (int k = 0; k < s.top_k; ++k) add_owner(s, __ldg(ids_row + k), mask);
  return mask;
}

__device__ __forceinline__ int32_t* histogram_of(const DispatchParams& p, RoutingShared& sh) {
  return p.ctx.shape.num_experts <= kSharedHistogram ? sh.histogram
                                                     : p.ctx.local<int32_t>(p.ctx.offsets.expert_hist);
}

// Counts pick k of a token, `id`, for its expert, or reports it when it is
// bad (first = lowest (token, pick), as the HOST backend reports it).
__device__ __forceinline__ void count_pick(const DispatchParams& p, int32_t token, int k, int32_t id, int32_t* hist) {
  const GroupShape& s = p.ctx.shape;
  if (is_valid_expert(s, id)) {
    atomicAdd(hist + id, 1);
  } else if (id != s.invalid_expert_id) {
    DeviceErrors* errors = &p.ctx.control()->errors;
    atomicAdd(&errors->bad_id_count, 1u);
    const uint64_t position = static_cast<uint64_t>(token) * s.top_k + k;
    atomicMin(reinterpret_cast<unsigned long long*>(&errors->bad_id_first),
              static_cast<unsigned long long>((position << 32) | static_cast<uint32_t>(id)));
  }
}

// Counts every pick of a token, one load at a time (unrolled, the general
// kernel's register path spilled 12 / 28 bytes against 4 / 4).
__device__ inline void count_picks(const DispatchParams& p, int32_t token, int32_t* hist) {
  const int top_k = p.ctx.shape.top_k;
  const int32_t* row = p.args.topk_ids + static_cast<int64_t>(token) * top_k;
#pragma unroll 1
  for (int k = 0; k < top_k; ++k) count_pick(p, token, k, __ldg(row + k), hist);
}

// One round of kBlockThreads tokens starting at `base`: per-rank counts of
// the round, then the slots of the own tokens [t0, t1) in it.
__device__ inline void route_round(const DispatchParams& p, int base, uint64_t mask, int t0, int t1,
                                   RoutingShared& sh) {
  const int world = p.ctx.shape.world_size;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = base + static_cast<int>(threadIdx.x);
  for (int d = 0; d < world; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) sh.warp_counts[warp][d] = __popc(ballot);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    uint32_t running = sh.totals[d];
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      sh.warp_offsets[w][d] = running;
      running += sh.warp_counts[w][d];
    }
    sh.totals[d] = running;
  }
  __syncthreads();
  if (base >= t1 || base + kBlockThreads <= t0) return;  // block-uniform: no own token in this round
  const bool own = t >= t0 && t < t1;
  const uint32_t lanes_below = (1u << lane) - 1u;
  int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t) * world;
  for (int d = 0; d < world; ++d) {
    const bool goes = (mask >> d) & 1u;
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, goes);
    const uint32_t earlier = sh.warp_offsets[warp][d] + __popc(ballot & lanes_below);
    if (own) slots[d] = goes ? static_cast<int32_t>(earlier) : -1;
    if (t == t0) sh.before[d] = earlier;  // routed tokens before the block's first
  }
}

// Look-back, after routing: the block's own picks, counted in shared memory,
// added to the rank's global histogram, one add per expert that has any
// (each add by one thread, the whole block's picks in it).  Counting every
// pick straight into the global histogram sent every block's thousands of
// adds to the few lines that hold it, where they queued behind each other
// (v29).  Ends with a barrier: the block's publication (a release after it)
// covers these adds.
__device__ void add_block_histogram(const DispatchParams& p, const RoutingShared& sh) {
  int32_t* global = p.ctx.local<int32_t>(p.ctx.offsets.expert_hist);
  for (int x = threadIdx.x; x < p.ctx.shape.num_experts; x += blockDim.x) {
    const int32_t n = sh.histogram[x];
    if (n != 0) atomicAdd(global + x, n);
  }
  __syncthreads();
}

// General kernel, step 1: the tokens [from, t1), kBlockThreads per round:
// the slots of the own tokens [t0, t1) among the routed ones into token_slots,
// sh.totals = how many routed tokens go to each rank, sh.before = how many of
// [from, t0).  Look-back (from = t0): every block counts its own picks (with
// the bad-id report) and adds them to the global histogram; scan (from = 0):
// block G - 1, which routes every token, counts them all.  Counts go to
// shared memory where the experts fit (histogram_of), else straight to the
// global histogram.  The ids of kRoundsPerPass rounds are loaded before the
// first is used (latency).  Ends with a barrier.
__device__ void route_tokens(const DispatchParams& p, int from, int t0, int t1, RoutingShared& sh,
                             DispatchTrace& trace) {
  const GroupShape& s = p.ctx.shape;
  const bool counts_picks = p.args.lookback != 0 || sh.logical == static_cast<int32_t>(gridDim.x) - 1;
  int32_t* hist = histogram_of(p, sh);
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) {
    sh.totals[d] = 0;
    sh.before[d] = 0;
  }
  if (counts_picks && hist == sh.histogram) {
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) sh.histogram[x] = 0;
  }
  __syncthreads();
  trace.mark(DispatchTrace::kSetUp);
  for (int pass = from; pass < t1; pass += kBlockThreads * kRoundsPerPass) {
    uint64_t masks[kRoundsPerPass];
#pragma unroll
    for (int i = 0; i < kRoundsPerPass; ++i) {
      const int t = pass + i * kBlockThreads + static_cast<int>(threadIdx.x);
      masks[i] = t < t1 ? token_mask(s, p.args.topk_ids + static_cast<int64_t>(t) * s.top_k) : 0;
    }
    if (counts_picks) {
#pragma unroll
      for (int i = 0; i < kRoundsPerPass; ++i) {
        const int t = pass + i * kBlockThreads + static_cast<int>(threadIdx.x);
        if (t < t1) count_picks(p, t, hist);
      }
    }
#pragma unroll
    for (int i = 0; i < kRoundsPerPass; ++i) {
      const int base = pass + i * kBlockThreads;
      if (base < t1) route_round(p, base, masks[i], t0, t1, sh);
    }
  }
  if (t0 == t1) {  // no own token: every routed token is before the block's (none are, on a look-back)
    for (int d = threadIdx.x; d < s.world_size; d += blockDim.x) sh.before[d] = sh.totals[d];
  }
  __syncthreads();  // totals, before final; histogram adds issued
  if (p.args.lookback != 0 && hist == sh.histogram) add_block_histogram(p, sh);
}

// Step 2a: block L's count per destination, tagged with the call.  A release
// per word (after the barrier that ended routing): whoever sees the word sees
// the block's histogram adds.
__device__ __forceinline__ void publish_own_counts(const DispatchParams& p, const RoutingShared& sh) {
  const int world = p.ctx.shape.world_size;
  uint64_t* words = p.ctx.local<uint64_t>(p.ctx.offsets.dispatch_lookback) + static_cast<int64_t>(sh.logical) * world;
  for (int d = threadIdx.x; d < world; d += blockDim.x)
    store_release_gpu(words + d, lookback_word(sh.tag, sh.totals[d]));
}

// Step 2b: sh.before = the counts of blocks 0 .. L - 1 per destination.  Each
// thread loads up to 4 words at once (relaxed), waits for those not yet this
// call's, and acquires them all with one fence.  A block whose wait timed out
// (recorded) returns false with the rest of the block: it sends nothing.
constexpr int kLookbackLoads = 4;
__device__ bool look_back(const DispatchParams& p, RoutingShared& sh) {
  const KernelContext& c = p.ctx;
  const int world = c.shape.world_size;
  const uint32_t tag = sh.tag;
  const uint64_t* words = c.local<uint64_t>(c.offsets.dispatch_lookback);
  const int n = sh.logical * world;
  bool ok = true;
  for (int first = threadIdx.x; first < n; first += kLookbackLoads * kBlockThreads) {
    uint64_t w[kLookbackLoads];
#pragma unroll
    for (int u = 0; u < kLookbackLoads; ++u) {
      const int i = first + u * kBlockThreads;
      w[u] = i < n ? load_relaxed_gpu(words + i) : 0;
    }
#pragma unroll
    for (int u = 0; u < kLookbackLoads; ++u) {
      const int i = first + u * kBlockThreads;
      if (i >= n || !ok) continue;
      if (!lookback_word_is_current(w[u], tag)) {
        uint64_t* seen = &w[u];
        ok = bounded_wait(
            [&] {
              *seen = load_relaxed_gpu(words + i);
              return lookback_word_is_current(*seen, tag);
            },
            c.control(), c.state.mirror, c.state.timeout_ns, kPhaseDispatch, c.shape.rank);
      }
      if (ok) atomicAdd(&sh.before[i % world], lookback_count(w[u]));
    }
  }
  fence_acq_rel_gpu();  // the words' publishers' histogram adds are visible to this block
  return __syncthreads_or(ok ? 0 : 1) == 0;
}

// A token's destinations for the sends: its slots (token_slots), after a
// look-back placed after the earlier blocks' tokens.
__device__ __forceinline__ TokenDestinations placed_destinations(const DispatchParams& p, const int32_t* slots_row,
                                                                 const RoutingShared& sh, int world, int lane) {
  TokenDestinations d = TokenDestinations::load(slots_row, world, lane);
  if (p.args.lookback != 0) {
    if (d.slot_low >= 0) d.slot_low += static_cast<int32_t>(sh.before[lane]);
    if (d.slot_high >= 0) d.slot_high += static_cast<int32_t>(sh.before[lane + 32]);
  }
  return d;
}

// After a look-back's sends (behind a barrier: nothing reads them any more),
// the own tokens' slots in token_slots become the final ones, which combine
// reads.
__device__ void store_placed_slots(const DispatchParams& p, int t0, int t1, const RoutingShared& sh) {
  if (p.args.lookback == 0 || sh.logical == 0) return;  // already final; nothing before block 0
  const int world = p.ctx.shape.world_size;
  int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t0) * world;
  const int n = (t1 - t0) * world;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t v = slots[i];
    if (v >= 0) slots[i] = v + static_cast<int32_t>(sh.before[i % world]);
  }
}

// What a source publishes with its rows, in one 64-bit store: its call's
// tokens_per_rank and how many rows it wrote to the destination.
__device__ __forceinline__ uint64_t published_rows(int32_t tokens_per_rank, uint32_t rows) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(tokens_per_rank)) << 32) | rows;
}

// Off the path: called only for a refused count.
__device__ __noinline__ void record_peer_count_error(ControlBlock* control, const PeerCountError& error) {
  DeviceErrors* e = &control->errors;
  if (atomicAdd(&e->peer_count_errors, 1u) == 0) e->first_peer_count_error = error;
}

// The rows this rank takes from `source`: all it published, if its call had
// this rank's tokens_per_rank and the rows fit in it; else none, and the
// refusal is recorded for the host (INVALID_INPUT on every rank, since every
// rank of a mismatched call sees a peer that differs).  So recv_counts, and
// combine's rows read from the caller's expert_output, stay within this
// rank's own tokens_per_rank whatever a peer sends.  A compare on a value
// already loaded: nothing is added to the path.
__device__ __forceinline__ int32_t accepted_rows(const KernelContext& c, int32_t source, uint64_t published,
                                                 int32_t tokens_per_rank) {
  const int32_t source_tokens_per_rank = static_cast<int32_t>(published >> 32);
  const uint32_t rows = static_cast<uint32_t>(published);
  if (source_tokens_per_rank == tokens_per_rank && rows <= static_cast<uint32_t>(tokens_per_rank)) {
    return static_cast<int32_t>(rows);
  }
  record_peer_count_error(c.control(), PeerCountError{source, source_tokens_per_rank, static_cast<int32_t>(rows),
                                                       tokens_per_rank});
  return 0;
}

// What every destination needs besides rows: how many rows this rank sends
// it (`rows`, with its tokens_per_rank), this rank's picks per expert it owns
// (`hist`), this rank's EPLB row.  Plain stores; the sending block's release
// covers them.
__device__ void send_counts(const DispatchParams& p, const uint32_t* rows, const int32_t* hist) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int world = s.world_size, epr = s.experts_per_rank, E = s.num_experts;
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    c.remote<uint64_t>(d, c.offsets.dispatch_counts_in)[s.rank] = published_rows(p.args.tokens_per_rank, rows[d]);
  }
  for (int i = threadIdx.x; i < world * epr; i += blockDim.x) {
    const int d = i / epr, e = i % epr;
    c.remote<int32_t>(d, c.offsets.expert_counts_in)[s.rank * epr + e] = hist[d * epr + e];
  }
  if (s.eplb_enabled) {
    for (int i = threadIdx.x; i < world * E; i += blockDim.x) {
      const int d = i / E, x = i % E;
      const int32_t v = p.args.eplb_local ? __ldg(p.args.eplb_local + x) : hist[x];
      c.remote<int32_t>(d, c.offsets.eplb_gathered)[static_cast<int64_t>(s.rank) * E + x] = v;
    }
  }
}

// Step 2, hidden rows that are 16-byte aligned: a segment of kSegmentBytes is
// loaded once into registers, then stored to every destination.
__device__ __forceinline__ int segment_vectors(const GroupShape& s, int segment) {
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  return static_cast<int>((s.hidden_row_bytes - offset < kSegmentBytes ? s.hidden_row_bytes - offset : kSegmentBytes) /
                          16);
}

__device__ __forceinline__ void load_segment(const DispatchParams& p, int32_t token, int segment, int lane,
                                             uint4 (&v)[kVectorsPerLane]) {
  const GroupShape& s = p.ctx.shape;
  const int vectors = segment_vectors(s, segment);
  const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(p.args.hidden) +
                                                    static_cast<int64_t>(token) * s.hidden_row_bytes +
                                                    static_cast<int64_t>(segment) * kSegmentBytes);
#pragma unroll
  for (int u = 0; u < kVectorsPerLane; ++u) {
    if (u * 32 + lane < vectors) v[u] = __ldg(src + u * 32 + lane);
  }
}

// Measurement builds only (-DMOE_EP_DIAGNOSTICS, scripts/gpu): the ranks whose
// hidden rows are left unwritten, to time the rest (results are then wrong).
__device__ __forceinline__ uint64_t rows_left_out(const DispatchParams& p) {
#ifdef MOE_EP_DIAGNOSTICS
  const uint64_t own = uint64_t{1} << p.ctx.shape.rank;
  const int which = p.args.diagnostic & 3;
  return which == 1 ? own : which == 2 ? ~own : 0;
#else
  (void)p;
  return 0;
#endif
}

__device__ __forceinline__ void store_segment(const DispatchParams& p, int segment, const TokenDestinations& dests,
                                              int lane, const uint4 (&v)[kVectorsPerLane]) {
  const GroupShape& s = p.ctx.shape;
  const int vectors = segment_vectors(s, segment);
  const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
  for (uint64_t rest = dests.mask & ~rows_left_out(p); rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    uint4* dst = reinterpret_cast<uint4*>(p.ctx.rank_base(d) + p.ctx.offsets.recv_hidden +
                                          row * s.hidden_row_bytes + offset);
#pragma unroll
    for (int u = 0; u < kVectorsPerLane; ++u) {
      if (u * 32 + lane < vectors) dst[u * 32 + lane] = v[u];
    }
  }
}

// Step 2 for rows of any size and alignment: the whole row, per destination.
__device__ inline void send_hidden_row_any(const DispatchParams& p, int32_t token, const TokenDestinations& dests,
                                           int lane) {
  const GroupShape& s = p.ctx.shape;
  const char* src = static_cast<const char*>(p.args.hidden) + static_cast<int64_t>(token) * s.hidden_row_bytes;
  for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    warp_copy_bytes(p.ctx.rank_base(d) + p.ctx.offsets.recv_hidden + row * s.hidden_row_bytes, src,
                    s.hidden_row_bytes, lane);
  }
}

// Step 2, the small parts of a token: ids rewritten for each destination
// (picks it does not own become the invalid id), weights (0 without), scales.
__device__ inline void send_token_meta(const DispatchParams& p, int32_t token, const TokenDestinations& dests,
                                       int lane) {
  const GroupShape& s = p.ctx.shape;
  const int K = s.top_k;
  const int32_t* ids = p.args.topk_ids + static_cast<int64_t>(token) * K;
  const float* weights = p.args.topk_weights ? p.args.topk_weights + static_cast<int64_t>(token) * K : nullptr;
  for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
    const int d = lowest_rank(rest);
    const int64_t row = static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + dests.slot(d);
    int32_t* ids_dst = p.ctx.remote<int32_t>(d, p.ctx.offsets.recv_ids) + row * K;
    float* weights_dst = p.ctx.remote<float>(d, p.ctx.offsets.recv_weights) + row * K;
    for (int k = lane; k < K; k += 32) {
      const int32_t id = __ldg(ids + k);
      const bool mine = is_valid_expert(s, id) && owner_of(s, id) == d;
      ids_dst[k] = mine ? id : s.invalid_expert_id;
      weights_dst[k] = weights ? __ldg(weights + k) : 0.0f;
    }
    if (s.scale_row_bytes > 0) {
      warp_copy_bytes(p.ctx.rank_base(d) + p.ctx.offsets.recv_scales + row * s.scale_row_bytes,
                      static_cast<const char*>(p.args.scales) + static_cast<int64_t>(token) * s.scale_row_bytes,
                      s.scale_row_bytes, lane);
    }
  }
}

// How a block's own tokens split into warp items: per token, the hidden row
// in segments (aligned rows) or whole (any other), then one item for ids,
// weights and scales.
struct OwnItems {
  int t0;
  bool aligned;
  int segments;
  int parts;
  int count;
  __device__ OwnItems(const DispatchParams& p, int t0, int t1) {
    const GroupShape& s = p.ctx.shape;
    this->t0 = t0;
    aligned = s.hidden_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.args.hidden) % 16 == 0;
    segments = aligned ? static_cast<int>((s.hidden_row_bytes + kSegmentBytes - 1) / kSegmentBytes) : 1;
    parts = segments + 1;
    count = (t1 - t0) * parts;
  }
  __device__ bool is_segment(int item) const { return aligned && item < count && item % parts < segments; }
};

// How a warp moves the aligned segments of its items: a policy of the one
// send path (send_own_tokens), chosen per call on the host
// (DispatchLaunch::bulk_rows).  Each policy has
//   kSharedBytes     the dynamic shared memory its kernels are launched with;
//   start()          before routing: work that does not depend on it;
//   abandon()        instead of sending, when the call does no work;
//   send(...)        one segment item, to the ranks `dests` names;
//   finish()         after the warp's last item, before the block publishes:
//                    every store written and ordered like an ordinary store.
//
// RegisterSegments: a segment is loaded into registers, then stored to every
// destination; the first segment of each warp is loaded before routing so
// that its latency hides behind the scan.
class RegisterSegments {
 public:
  __device__ RegisterSegments(const DispatchParams& p, int t0, int t1, char*) : p_(p), items_(p, t0, t1) {}
  static constexpr size_t kSharedBytes = 0;

  __device__ void start() {
    const int item = threadIdx.x / 32;
    prefetched_ = items_.is_segment(item);
    if (prefetched_) load_segment(p_, items_.t0 + item / items_.parts, item % items_.parts, threadIdx.x % 32, first_);
  }
  __device__ void abandon() {}
  __device__ void send(int item, int32_t token, int segment, const TokenDestinations& dests, int lane) {
    if (item == threadIdx.x / 32 && prefetched_) {
      store_segment(p_, segment, dests, lane, first_);
      return;
    }
    uint4 v[kVectorsPerLane];
    load_segment(p_, token, segment, lane, v);
    store_segment(p_, segment, dests, lane, v);
  }
  __device__ void finish() {}

 private:
  const DispatchParams& p_;
  const OwnItems items_;
  bool prefetched_ = false;
  uint4 first_[kVectorsPerLane];
};

// BulkSegments (compute capability 9.0, 16-byte aligned rows): lane 0 of each
// warp forwards its segments through a ring of kBulkStages shared-memory
// buffers (BulkStoreRing): each segment is read from HBM once with a bulk copy
// and written to every destination with bulk copies, kBulkStages - 1 segments
// read ahead; the first ones are read before routing.  The other lanes take
// part only in the warp-collective reads of the destinations.
constexpr int kBulkStages = 3;
// Dynamic shared memory of a block (also known to the host code, which has no
// __CUDA_ARCH__): each warp's buffers and barriers.
constexpr size_t kBulkSegmentsSharedBytes = size_t{kWarpsPerBlock} * kBulkStages * (kSegmentBytes + sizeof(uint64_t));
#ifdef MOE_EP_HAVE_BULK_COPY
using SegmentRing = BulkStoreRing<kBulkStages, kSegmentBytes>;
static_assert(kBulkSegmentsSharedBytes == kWarpsPerBlock * (SegmentRing::kBufferBytes + SegmentRing::kBarrierBytes),
              "the ring's layout");

class BulkSegments {
 public:
  __device__ BulkSegments(const DispatchParams& p, int t0, int t1, char* shared)
      : p_(p),
        items_(p, t0, t1),
        ring_(shared + static_cast<size_t>(threadIdx.x / 32) * SegmentRing::kBufferBytes,
              reinterpret_cast<uint64_t*>(shared + kWarpsPerBlock * SegmentRing::kBufferBytes) +
                  static_cast<size_t>(threadIdx.x / 32) * kBulkStages),
        next_item_(first_segment_item()) {}
  static constexpr size_t kSharedBytes = kBulkSegmentsSharedBytes;

  __device__ void start() {
    if (threadIdx.x % 32 != 0 || !items_.aligned) return;
    ring_.init();
    while (loaded_ < kBulkStages - 1 && load_next()) {
    }
  }
  // The loads already issued land before the block leaves.
  __device__ void abandon() {
    if (threadIdx.x % 32 == 0) ring_.drain_loads(loaded_, stored_, p_.ctx.state.timeout_ns);
  }
  // Segment items come in the order start() and load_next() walked them.
  __device__ void send(int, int32_t, int segment, const TokenDestinations& dests, int lane) {
    const GroupShape& s = p_.ctx.shape;
    const uint32_t n = stored_++;
    const bool landed = lane != 0 || failed_ || ring_.wait_loaded(n, p_.ctx.state.timeout_ns);
    if (!landed) {  // a local read that never finished: recorded, the warp sends no more segments
      record_timeout(p_.ctx.control(), p_.ctx.state.mirror, kPhaseDispatch, s.rank);
      failed_ = true;
    }
    // The buffer was written by the bulk load (seen through the barrier) and
    // is read by the bulk stores: order the two across the proxies.
    if (lane == 0 && !failed_) fence_shared_before_bulk_copy();
    const uint32_t bytes = static_cast<uint32_t>(segment_vectors(s, segment)) * 16u;
    const int64_t offset = static_cast<int64_t>(segment) * kSegmentBytes;
    for (uint64_t rest = dests.mask; rest != 0; rest &= rest - 1) {
      const int d = lowest_rank(rest);
      const int64_t row = static_cast<int64_t>(s.rank) * p_.args.tokens_per_rank + dests.slot(d);  // every lane
      if (lane == 0 && !failed_) {
        ring_.store(n, p_.ctx.rank_base(d) + p_.ctx.offsets.recv_hidden + row * s.hidden_row_bytes + offset, bytes);
      }
    }
    if (lane == 0 && !failed_) {
      ring_.end_stores();
      load_next();
    }
  }
  __device__ void finish() {
    if (threadIdx.x % 32 == 0 && items_.aligned) ring_.wait_all_written();
  }

 private:
  __device__ int first_segment_item() const {
    const int item = threadIdx.x / 32;
    return items_.is_segment(item) || item >= items_.count ? item : following_segment_item(item);
  }
  __device__ int following_segment_item(int item) const {
    do {
      item += kWarpsPerBlock;
    } while (item < items_.count && !items_.is_segment(item));
    return item;
  }
  // Lane 0: reads the warp's next segment item into the ring; false when
  // there is none.
  __device__ bool load_next() {
    if (next_item_ >= items_.count) return false;
    const GroupShape& s = p_.ctx.shape;
    const int32_t token = items_.t0 + next_item_ / items_.parts;
    const int segment = next_item_ % items_.parts;
    const char* src = static_cast<const char*>(p_.args.hidden) + static_cast<int64_t>(token) * s.hidden_row_bytes +
                      static_cast<int64_t>(segment) * kSegmentBytes;
    ring_.load(loaded_++, src, static_cast<uint32_t>(segment_vectors(s, segment)) * 16u);
    next_item_ = following_segment_item(next_item_);
    return true;
  }

  const DispatchParams& p_;
  const OwnItems items_;
  SegmentRing ring_;
  int next_item_;        // lane 0: the next segment item to load
  uint32_t loaded_ = 0;  // lane 0: segments loaded
  uint32_t stored_ = 0;  // every lane: segments sent (ring slot numbers)
  bool failed_ = false;  // lane 0: a load timed out
};
#else
// Device code for an architecture without bulk copies (a build whose lowest
// architecture is below 9.0, run on a newer device): the register path, the
// shared memory given at launch unused.
class BulkSegments : public RegisterSegments {
 public:
  static constexpr size_t kSharedBytes = kBulkSegmentsSharedBytes;
  __device__ BulkSegments(const DispatchParams& p, int t0, int t1, char* shared)
      : RegisterSegments(p, t0, t1, shared) {}
};
#endif

// Step 2: the own tokens [t0, t1) as warp items (OwnItems), each sent to the
// ranks `destinations_of(token, lane)` names.  One code path for both
// kernels and both segment policies: the general kernel reads a token's slots
// back from token_slots, the small-batch kernel derives them from its shared
// ballots; `segments` moves the aligned hidden segments.
template <typename Segments, typename DestinationsOf>
__device__ __forceinline__ void send_own_tokens(const DispatchParams& p, int t0, int t1, Segments& segments,
                                                const DestinationsOf& destinations_of) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const OwnItems items(p, t0, t1);
  for (int item = warp; item < items.count; item += kWarpsPerBlock) {
    const int32_t token = t0 + item / items.parts;
    const int part = item % items.parts;
    const TokenDestinations dests = destinations_of(token, lane);
    if (part == items.segments) {
      send_token_meta(p, token, dests, lane);
    } else if (!items.aligned) {
      send_hidden_row_any(p, token, dests, lane);
    } else {
      segments.send(item, token, part, dests, lane);
    }
  }
  segments.finish();
}

// The rows of [0, t1) bound to rank d: after a look-back, the earlier blocks'
// and the own; after a scan, every routed one.
__device__ __forceinline__ uint32_t rows_through_own(const DispatchParams& p, const RoutingShared& sh, int d) {
  return p.args.lookback != 0 ? sh.before[d] + sh.totals[d] : sh.totals[d];
}

// General kernel, block G - 1 (the last ticket), after its look-back or
// scan: it knows the totals, and the histogram is complete (after a
// look-back every other block's adds were acquired with its word; a scan
// counted them all here).  Sends the counts, then leaves a global histogram
// at zero for the next call and, after a look-back, rewrites the words of the
// blocks beyond this grid with this call's tag (dispatch_lookback.h).
__device__ void send_totals(const DispatchParams& p, RoutingShared& sh) {
  const KernelContext& c = p.ctx;
  const int world = c.shape.world_size;
  for (int d = threadIdx.x; d < world; d += blockDim.x) sh.all_rows[d] = rows_through_own(p, sh, d);
  __syncthreads();
  int32_t* hist = p.args.lookback != 0 ? c.local<int32_t>(c.offsets.expert_hist) : histogram_of(p, sh);
  send_counts(p, sh.all_rows, hist);
  __syncthreads();  // every count read before the histogram is zeroed
  if (hist != sh.histogram) {
    for (int x = threadIdx.x; x < c.shape.num_experts; x += blockDim.x) hist[x] = 0;
  }
  if (p.args.lookback == 0) return;
  uint64_t* words = c.local<uint64_t>(c.offsets.dispatch_lookback);
  const int from = static_cast<int>(gridDim.x) * world, to = p.args.max_blocks * world;
  for (int i = from + static_cast<int>(threadIdx.x); i < to; i += blockDim.x) words[i] = lookback_word(sh.tag, 0);
}

// Padding rows r in [r0, r1) of this rank's segment on rank d.
__device__ __forceinline__ void pad_rows(const DispatchParams& p, int d, int32_t r0, int32_t r1) {
  const GroupShape& s = p.ctx.shape;
  const int64_t first = (static_cast<int64_t>(s.rank) * p.args.tokens_per_rank + r0) * s.top_k;
  const int n = (r1 - r0) * s.top_k;
  int32_t* ids = p.ctx.remote<int32_t>(d, p.ctx.offsets.recv_ids) + first;
  float* weights = p.ctx.remote<float>(d, p.ctx.offsets.recv_weights) + first;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    ids[i] = s.invalid_expert_id;
    weights[i] = 0.0f;
  }
}

// How many of the tokens [0, t0) and [0, t1) go to one destination.
struct BoundRows {
  int32_t before;   // of [0, t0)
  int32_t through;  // of [0, t1)
};

// Step 3b, both kernels: the padding rows of the block with logical index L
// that owns tokens [t0, t1), on every destination (dispatch_lookback.h): one
// per own token that does not go there, counted from the back of [0, T), and
// its share of [T, tpr).  `bound_of(d)` says how many tokens before and up to
// its own go to d.  No block needs the totals.
template <typename BoundOf>
__device__ void write_block_padding(const DispatchParams& p, int t0, int t1, int32_t logical, const BoundOf& bound_of) {
  const int32_t T = p.args.num_tokens;
  int32_t tail0, tail1;
  block_tail_rows(T, p.args.tokens_per_rank, static_cast<int32_t>(gridDim.x), logical, &tail0, &tail1);
  for (int d = 0; d < p.ctx.shape.world_size; ++d) {
    const BoundRows bound = bound_of(d);
    int32_t r0, r1;
    block_padding_rows(T, t0, t1, bound.before, bound.through - bound.before, &r0, &r1);
    pad_rows(p, d, r0, r1);
    pad_rows(p, d, tail0, tail1);
  }
}

// Block 0, last: wait until every rank's blocks have all arrived here, then
// produce recv_counts and local_expert_counts.  One barrier after every wait,
// then every count load in one round (L2 loads, ordered after the waits'
// acquires by the barrier).  `wait_ok` is shared memory of kMaxWorldSize
// entries.  (epoch was read at kernel start: only this block of the previous
// call wrote it, and this one writes it once every block of the rank has
// arrived, so after each has read it.)  `zero_histogram`: the small kernel
// leaves the global histogram at zero here (large E); the general kernel's
// last block does it (send_totals).
__device__ void finish_dispatch(const DispatchParams& p, uint64_t epoch, RoutingShared& sh, uint32_t* wait_ok,
                                bool zero_histogram, DispatchTrace& trace) {
  const KernelContext& c = p.ctx;
  const GroupShape& s = c.shape;
  const int world = s.world_size, epr = s.experts_per_rank;
  for (int src = threadIdx.x; src < world; src += blockDim.x) {
    const uint64_t* arrivals = c.local<uint64_t>(c.offsets.dispatch_arrivals) + src;
    wait_ok[src] = wait_until_at_least(arrivals, epoch * kArrivalsPerCall, c.control(), c.state.mirror,
                                       c.state.timeout_ns, kPhaseDispatch, src)
                       ? 1u
                       : 0u;
  }
  if (zero_histogram && s.num_experts > kSharedHistogram) {  // the global histogram starts the next call at zero
    int32_t* hist = histogram_of(p, sh);
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) hist[x] = 0;
  }
  __syncthreads();
  trace.mark_waited();
  const uint64_t* counts_in = c.local<uint64_t>(c.offsets.dispatch_counts_in);
  const int32_t* experts_in = c.local<int32_t>(c.offsets.expert_counts_in);
  const int src = threadIdx.x;  // world <= kMaxWorldSize < kBlockThreads
  const int32_t count =
      src < world && wait_ok[src] != 0 ? accepted_rows(c, src, __ldcg(counts_in + src), p.args.tokens_per_rank) : 0;
  int32_t* local_expert_counts = c.local<int32_t>(c.offsets.local_expert_counts);
  for (int e = threadIdx.x; e < epr; e += blockDim.x) {
    int32_t sum = 0;
    for (int q = 0; q < world; ++q) sum += __ldcg(experts_in + q * epr + e);
    local_expert_counts[e] = sum;
  }
  if (src < world) {
    c.local<int32_t>(c.offsets.recv_counts)[src] = count;
    c.local<int32_t>(c.offsets.counts_private)[src] = count;
  }
  if (threadIdx.x == 0) c.control()->epoch = epoch;  // combine reads it; the next dispatch advances it
}

// Shared memory given at launch: the segment policy's buffers.
extern __shared__ __align__(128) char segment_shared[];

// Thread 0: this block's logical index; the block that draws the last one
// sets the ticket back to 0 for the next call (every block of this grid has
// drawn by then, and the next dispatch starts after this grid has completed).
__device__ __forceinline__ int32_t draw_logical_block(ControlBlock* control) {
  const uint32_t L = atomicAdd(&control->dispatch_ticket, 1u);
  if (L == gridDim.x - 1) atomicExch(&control->dispatch_ticket, 0u);
  return static_cast<int32_t>(L);
}

template <typename Segments>
__global__ void __launch_bounds__(kBlockThreads, 1) dispatch_kernel(const DispatchParams p) {
  __shared__ RoutingShared sh;
  __shared__ uint32_t wait_ok[kMaxWorldSize];
  wait_for_prior_grid();
  allow_dependent_launch();
  ControlBlock* control = p.ctx.control();
  DispatchTrace trace(p);
  const bool lookback = p.args.lookback != 0;
  if (threadIdx.x == 0) {
    sh.logical = lookback ? draw_logical_block(control) : static_cast<int32_t>(blockIdx.x);
    sh.timed_out = *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase);
    sh.epoch = *reinterpret_cast<const volatile uint64_t*>(&control->epoch) + 1;
    sh.tag = *reinterpret_cast<const volatile uint32_t*>(&control->lookback_tag) + 1u;
  }
  __syncthreads();
  if (sh.timed_out != kPhaseNone) return;  // block-uniform; the ticket was drawn (and reset)
  int32_t t0, t1;
  own_token_range(p.args.num_tokens, gridDim.x, sh.logical, kTokenShareUnit, p.args.last_block_share, &t0, &t1);
  Segments segments(p, t0, t1, segment_shared);
  segments.start();
  route_tokens(p, lookback ? t0 : 0, t0, t1, sh, trace);  // ends with a barrier
  trace.mark(DispatchTrace::kFirstRound);
  if (lookback) {
    publish_own_counts(p, sh);
    if (!look_back(p, sh)) {  // block-uniform; a timeout was recorded
      segments.abandon();
      return;
    }
  }
  trace.mark(DispatchTrace::kRouted);
  if (sh.logical == static_cast<int32_t>(gridDim.x) - 1) send_totals(p, sh);
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int world = p.ctx.shape.world_size;
  send_own_tokens(p, t0, t1, segments, [&](int32_t token, int lane) {
    return placed_destinations(p, slots + static_cast<int64_t>(token) * world, sh, world, lane);
  });
  trace.mark(DispatchTrace::kSent);
  write_block_padding(p, t0, t1, sh.logical, [&](int d) {
    return BoundRows{static_cast<int32_t>(sh.before[d]), static_cast<int32_t>(rows_through_own(p, sh, d))};
  });
  trace.mark(DispatchTrace::kPadded);
  trace.store();
  publish_block_arrival(p.ctx, p.ctx.offsets.dispatch_arrivals);  // step 4 (starts with a barrier)
  trace.mark_published();
  store_placed_slots(p, t0, t1, sh);
  if (blockIdx.x == 0) {
    finish_dispatch(p, sh.epoch, sh, wait_ok, false, trace);
    if (lookback && threadIdx.x == 0) control->lookback_tag = sh.tag;  // as the epoch: every block has read it
    trace.print(sh.epoch);
  }
}

// ---- Small-batch kernel (tokens_per_rank <= kSmallDispatchMaxTokens) -------
// The same work, protocol, counters and results as dispatch_kernel, with fewer
// dependent steps on the path of a small call (docs/nvlink_backend.md, v5):
// the routing is one round (T <= kBlockThreads); a token's slots are derived
// from the shared ballots instead of being read back from token_slots (which
// is still written: combine reads it); the timeout record waits in a register
// instead of holding up routing's first barrier; the own tokens' weight rows
// are prefetched; block 0, which counts every pick, takes a smaller share of
// the tokens (none on small calls, so that its counts are not queued behind a
// row; small_first_block_share); and block 0's count loads after the waits
// are issued in one round.
static_assert(kSmallDispatchMaxTokens <= kBlockThreads, "the small-batch routing is one round");

struct SmallShared {
  RoutingShared r;                 // r.warp_counts holds each warp's ballots (bit per token)
  uint64_t masks[kBlockThreads];   // destinations of every local token
  uint32_t wait_ok[kMaxWorldSize];
};

// Slot of local token `token` on rank d, -1 when it does not go there.
__device__ __forceinline__ int32_t small_slot(const SmallShared& sh, int token, int d) {
  const int w = token / 32;
  const uint32_t below = (1u << (token % 32)) - 1u;
  return ((sh.masks[token] >> d) & 1u) != 0
             ? static_cast<int32_t>(sh.r.warp_offsets[w][d] + __popc(sh.r.warp_counts[w][d] & below))
             : -1;
}

// How many of the local tokens [0, x) go to rank d (x <= kBlockThreads).
__device__ __forceinline__ int32_t small_bound_before(const SmallShared& sh, int x, int d) {
  const int w = x / 32;
  if (w >= kWarpsPerBlock) return static_cast<int32_t>(sh.r.totals[d]);
  return static_cast<int32_t>(sh.r.warp_offsets[w][d] + __popc(sh.r.warp_counts[w][d] & ((1u << (x % 32)) - 1u)));
}

__device__ __forceinline__ TokenDestinations small_destinations(const SmallShared& sh, int token, int world,
                                                                int lane) {
  TokenDestinations d;
  d.slot_low = lane < world ? small_slot(sh, token, lane) : -1;
  d.slot_high = lane + 32 < world ? small_slot(sh, token, lane + 32) : -1;
  d.mask = sh.masks[token];
  return d;
}

// Step 1 in one round: thread t routes token t.  Ends with a barrier after
// which sh.r.totals, the slots and sh.r.timed_out are final.
__device__ void route_small(const DispatchParams& p, int t0, int t1, uint32_t timed_out, SmallShared& sh) {
  const GroupShape& s = p.ctx.shape;
  const int T = p.args.num_tokens, world = s.world_size;
  const int t = threadIdx.x, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool counts_picks = blockIdx.x == 0;
  int32_t* hist = histogram_of(p, sh.r);
  // The token's first kHeldPicks ids are loaded once, in one round whose
  // latency the histogram's zeroing and its barrier hide, and give both the
  // mask and block 0's counts (v31; they were two load rounds of 4 for the
  // mask, then the counts' reloads after the barrier).
  constexpr int kHeldPicks = 8;
  const int32_t* ids = p.args.topk_ids + static_cast<int64_t>(t) * s.top_k;
  const int held = t < T ? min(s.top_k, kHeldPicks) : 0;
  int32_t id[kHeldPicks];
#pragma unroll
  for (int k = 0; k < kHeldPicks; ++k) id[k] = k < held ? __ldg(ids + k) : 0;
  if (counts_picks && hist == sh.r.histogram) {
    for (int x = threadIdx.x; x < s.num_experts; x += blockDim.x) sh.r.histogram[x] = 0;
  }
  __syncthreads();
  uint64_t mask = 0;
#pragma unroll
  for (int k = 0; k < kHeldPicks; ++k) {
    if (k >= held) break;
    add_owner(s, id[k], mask);
    if (counts_picks) count_pick(p, t, k, id[k], hist);
  }
  for (int k = kHeldPicks; t < T && k < s.top_k; ++k) {  // top_k > kHeldPicks: the rest one by one
    const int32_t x = __ldg(ids + k);
    add_owner(s, x, mask);
    if (counts_picks) count_pick(p, t, k, x, hist);
  }
  sh.masks[t] = mask;
  for (int d = 0; d < world; ++d) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, (mask >> d) & 1u);
    if (lane == 0) sh.r.warp_counts[warp][d] = ballot;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < world; d += blockDim.x) {
    uint32_t running = 0;
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      sh.r.warp_offsets[w][d] = running;
      running += __popc(sh.r.warp_counts[w][d]);
    }
    sh.r.totals[d] = running;
  }
  if (threadIdx.x == 0) sh.r.timed_out = timed_out;
  __syncthreads();
  if (t >= t0 && t < t1) {  // kept for combine
    int32_t* row = p.ctx.local<int32_t>(p.ctx.offsets.token_slots) + static_cast<int64_t>(t) * world;
    for (int d = 0; d < world; ++d) row[d] = small_slot(sh, t, d);
  }
}

template <typename Segments>
__global__ void __launch_bounds__(kBlockThreads, 1) dispatch_small_kernel(const DispatchParams p) {
  __shared__ SmallShared sh;
  wait_for_prior_grid();
  allow_dependent_launch();
  DispatchTrace trace(p);
  ControlBlock* control = p.ctx.control();
  int32_t t0, t1;  // block 0 counts every pick first: a smaller share, none on small calls
  own_token_range(p.args.num_tokens, gridDim.x, blockIdx.x, p.args.first_block_share, kTokenShareUnit, &t0, &t1);
  const uint32_t timed_out =
      threadIdx.x == 0 ? *reinterpret_cast<const volatile uint32_t*>(&control->errors.timeout_phase) : 0u;
  const uint64_t epoch =
      blockIdx.x == 0 ? *reinterpret_cast<const volatile uint64_t*>(&control->epoch) + 1 : uint64_t{0};
  Segments segments(p, t0, t1, segment_shared);
  segments.start();
  if (p.args.topk_weights != nullptr) {
    for (int t = t0 + static_cast<int>(threadIdx.x); t < t1; t += blockDim.x) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(p.args.topk_weights + static_cast<int64_t>(t) * p.ctx.shape.top_k));
    }
  }
  trace.mark(DispatchTrace::kSetUp);
  route_small(p, t0, t1, timed_out, sh);  // ends with a barrier
  trace.mark(DispatchTrace::kFirstRound);
  if (sh.r.timed_out != kPhaseNone) {     // block-uniform
    segments.abandon();
    return;
  }
  if (blockIdx.x == 0) send_counts(p, sh.r.totals, histogram_of(p, sh.r));
  trace.mark(DispatchTrace::kRouted);
  const int world = p.ctx.shape.world_size;
  send_own_tokens(p, t0, t1, segments,
                  [&](int32_t token, int lane) { return small_destinations(sh, token, world, lane); });
  trace.mark(DispatchTrace::kSent);
  write_block_padding(p, t0, t1, static_cast<int32_t>(blockIdx.x), [&](int d) {
    return BoundRows{small_bound_before(sh, t0, d), small_bound_before(sh, t1, d)};
  });
  trace.mark(DispatchTrace::kPadded);
  trace.store();
  publish_block_arrival(p.ctx, p.ctx.offsets.dispatch_arrivals);
  trace.mark_published();
  if (blockIdx.x == 0) {
    finish_dispatch(p, epoch, sh.r, sh.wait_ok, true, trace);
    trace.print(epoch);
  }
}

}  // namespace

int32_t dispatch_blocks(const GroupShape& shape, int32_t num_tokens, int32_t tokens_per_rank, int32_t sm_budget) {
  // About one block per token (rows are large), enough blocks for the padding
  // when few tokens are sent, never more than the SMs the handle may use.
  const int64_t padding_blocks = (static_cast<int64_t>(shape.world_size) * tokens_per_rank + 255) / 256;
  int64_t blocks = num_tokens > padding_blocks ? num_tokens : padding_blocks;
  if (blocks > sm_budget) blocks = sm_budget;
  if (blocks > kMaxDispatchBlocks) blocks = kMaxDispatchBlocks;  // the look-back words' rows
  return blocks < 1 ? 1 : static_cast<int32_t>(blocks);
}

namespace {

// The bulk kernels' shared-memory limit is raised once per device and kernel,
// not on every call (dispatch is on the caller's hot path).
std::atomic<uint64_t> bulk_general_raised{0};
std::atomic<uint64_t> bulk_small_raised{0};

template <typename Segments>
void (*dispatch_kernel_for(bool small))(DispatchParams) {
  return small ? dispatch_small_kernel<Segments> : dispatch_kernel<Segments>;
}

std::atomic<uint64_t>* bulk_raised(bool small) { return small ? &bulk_small_raised : &bulk_general_raised; }

template <typename Segments>
cudaError_t launch_with(bool small, const DispatchParams& p, cudaStream_t stream) {
  const size_t shared = Segments::kSharedBytes;
  if (shared > 0) {
    const cudaError_t e =
        raise_dynamic_shared_limit_once(dispatch_kernel_for<Segments>(small), shared, bulk_raised(small));
    if (e != cudaSuccess) return e;
  }
  return launch_kernel(dispatch_kernel_for<Segments>(small), p.args.num_blocks, kBlockThreads, shared, stream,
                       p.args.pdl, p);
}

}  // namespace

cudaError_t prepare_dispatch(int32_t bulk_rows) {
  if (bulk_rows == 0) return cudaSuccess;
  for (const bool small : {false, true}) {
    const cudaError_t e = raise_dynamic_shared_limit_once(dispatch_kernel_for<BulkSegments>(small),
                                                          BulkSegments::kSharedBytes, bulk_raised(small));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t launch_dispatch(const GroupShape& shape, const WorkspaceOffsets& offsets, const HandleState& state,
                            const DispatchLaunch& args, cudaStream_t stream) {
  DispatchParams p;
  p.ctx.shape = shape;
  p.ctx.offsets = offsets;
  p.ctx.state = state;
  p.args = args;
  const bool small = args.small_batch != 0 && args.tokens_per_rank <= kSmallDispatchMaxTokens;
  // Bulk copies need 16-byte aligned rows and sources; any other call keeps
  // the register path (which also handles rows of any size).
  const bool bulk =
      args.bulk_rows != 0 && shape.hidden_row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(args.hidden) % 16 == 0;
  return bulk ? launch_with<BulkSegments>(small, p, stream) : launch_with<RegisterSegments>(small, p, stream);
}

}  // namespace kernels
}  // namespace moe_ep
