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
//   registers (MOE_EP_PULL_ROWS=0 and MOE_EP_PULL_LOADS=registers, or a build
//     without bulk copies): 16-byte loads
//     (pull_reduce_registers);
//   any other row: element by element (pull_reduce_rows).
#include <stdint.h>

#include <atomic>

#include "bulk_copy.cuh"
#include "combine_common.cuh"
#include "device_sync.cuh"
#include "kernel_launch.cuh"
#include "pull_rows_schedule.h"

namespace moe_ep {
namespace kernels {
namespace {

constexpr int kPullStages = 6;
constexpr size_t kPullBufferBytes = size_t{kWarpsPerBlock} * kPullStages * kReduceSegmentBytes;
constexpr size_t kPullBarrierBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(uint64_t);
constexpr size_t kPullItemBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(int64_t);
constexpr size_t kPullRankBytes = size_t{kWarpsPerBlock} * kPullStages * sizeof(int32_t);
constexpr size_t kPullSegmentSharedBytes = kPullBufferBytes + kPullBarrierBytes + kPullItemBytes + kPullRankBytes;

// Rows of any size or alignment (and devices without bulk copies): a token per
// warp, element by element, from the same places.
template <typename Element>
__device__ void pull_reduce_rows(const CombineParams& p) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; token < p.args.num_tokens;
       token += step) {
    const TokenDestinations srcs = TokenDestinations::load(slots + token * s.world_size, s.world_size, lane);
    reduce_row_any<Element>(p, static_cast<int32_t>(token), srcs, lane);
  }
}

// Aligned rows, partials loaded into registers (MOE_EP_PULL_LOADS=registers):
// what every warp keeps in flight is 4 KiB (two ranks' 2 KiB segments).
template <typename Element>
__device__ void pull_reduce_registers(const CombineParams& p) {
  const GroupShape& s = p.ctx.shape;
  const int lane = threadIdx.x % 32;
  const int32_t* slots = p.ctx.local<int32_t>(p.ctx.offsets.token_slots);
  const int segments = reduce_segments(p, true);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; item < items;
       item += step) {
    const int64_t token = item / segments;
    const TokenDestinations srcs = TokenDestinations::load(slots + token * s.world_size, s.world_size, lane);
    reduce_segment<Element>(p, static_cast<int32_t>(token), static_cast<int>(item % segments), srcs, lane);
  }
}

#ifdef MOE_EP_HAVE_BULK_COPY
// One warp's buffers and what each holds: the copy of one rank's partial of
// one (token, segment) item.
struct WarpStages {
  char* buffers;       // [kPullStages][kReduceSegmentBytes]
  uint64_t* barriers;  // [kPullStages]
  int64_t* items;      // [kPullStages]: the item whose partial the buffer holds
  int32_t* ranks;      // [kPullStages]: the rank that computed it (for a timeout record)

  __device__ WarpStages(char* shared, int warp) {
    const int first = warp * kPullStages;
    buffers = shared + static_cast<size_t>(first) * kReduceSegmentBytes;
    barriers = reinterpret_cast<uint64_t*>(shared + kPullBufferBytes) + first;
    items = reinterpret_cast<int64_t*>(shared + kPullBufferBytes + kPullBarrierBytes) + first;
    ranks = reinterpret_cast<int32_t*>(shared + kPullBufferBytes + kPullBarrierBytes + kPullItemBytes) + first;
  }
};

// The producer side of a warp: walks the same (item, rank) sequence as the
// consumer, issuing one bulk copy per step into the next free buffer.
class PartialProducer {
 public:
  __device__ PartialProducer(const CombineParams& p, const WarpStages& stages, int64_t first, int64_t step,
                             int64_t items, int segments)
      : p_(p), stages_(stages), item_(first - step), step_(step), items_(items), segments_(segments) {}

  // Warp-collective.  Issues the copy of the next partial into buffer
  // `issued % kPullStages`; false when every partial has been issued.
  __device__ bool issue(uint32_t issued) {
    const int lane = threadIdx.x % 32;
    const int world = p_.ctx.shape.world_size;
    while (rest_ == 0) {
      if (item_ + step_ >= items_) return false;
      item_ += step_;
      const int32_t* slots = p_.ctx.local<int32_t>(p_.ctx.offsets.token_slots);
      srcs_ = TokenDestinations::load(slots + (item_ / segments_) * world, world, lane);
      rest_ = srcs_.mask;
    }
    const int q = lowest_rank(rest_);
    rest_ &= rest_ - 1;
    const int32_t slot = srcs_.slot(q);  // every lane
    const int segment = static_cast<int>(item_ % segments_);
    const int stage = static_cast<int>(issued % kPullStages);
    if (lane == 0) {
      stages_.items[stage] = item_;
      stages_.ranks[stage] = q;
      fence_shared_before_bulk_copy();  // the buffer's last reads
      bulk_copy_to_shared(stages_.buffers + static_cast<size_t>(stage) * kReduceSegmentBytes,
                          partial_row(p_, q, slot) + static_cast<int64_t>(segment) * kReduceSegmentBytes,
                          static_cast<uint32_t>(reduce_segment_vectors(p_, segment)) * 16u, stages_.barriers + stage);
    }
    __syncwarp();  // the buffer's item and rank, for every lane
    return true;
  }

 private:
  const CombineParams& p_;
  const WarpStages& stages_;
  int64_t item_;
  const int64_t step_, items_;
  const int segments_;
  TokenDestinations srcs_{};
  uint64_t rest_ = 0;
};

// Aligned rows: bulk copies into the warp's buffers, kPullStages ahead.
template <typename Element>
__device__ void pull_reduce_bulk(const CombineParams& p, char* shared) {
  const KernelContext& c = p.ctx;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const WarpStages stages(shared, warp);
  if (lane == 0) {
    for (int s = 0; s < kPullStages; ++s) barrier_init(stages.barriers + s);
    barrier_init_fence();
    fence_global_before_bulk_copies();  // the handshake's acquires
  }
  __syncwarp();
  const int segments = reduce_segments(p, true);
  const int64_t items = static_cast<int64_t>(p.args.num_tokens) * segments;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  PartialProducer producer(p, stages, first, step, items, segments);
  uint32_t issued = 0, consumed = 0;
  while (issued < kPullStages && producer.issue(issued)) ++issued;
  for (int64_t item = first; item < items; item += step) {
    const int segment = static_cast<int>(item % segments);
    const int vectors = reduce_segment_vectors(p, segment);
    SegmentSums<Element> sums;
    auto& acc = sums.v;
    // The item's partials are the next buffers whose item is this one (none:
    // every pick of the token was masked, the output row is zeros).
    while (consumed < issued && stages.items[consumed % kPullStages] == item) {
      const int stage = static_cast<int>(consumed % kPullStages);
      const bool landed = barrier_wait(stages.barriers + stage, (consumed / kPullStages) & 1u, c.state.timeout_ns);
      if (!__all_sync(0xFFFFFFFFu, landed)) {  // the whole warp leaves, after the copies it issued (bounded)
        if (lane == 0) record_timeout(c.control(), c.state.mirror, kPhaseCombine, stages.ranks[stage]);
        for (uint32_t n = consumed; n < issued; ++n) {
          barrier_wait(stages.barriers + n % kPullStages, (n / kPullStages) & 1u, c.state.timeout_ns);
        }
        return;
      }
      const uint4* buffer =
          reinterpret_cast<const uint4*>(stages.buffers + static_cast<size_t>(stage) * kReduceSegmentBytes);
      uint4 v[kReduceVectorsPerLane] = {};
#pragma unroll
      for (int u = 0; u < kReduceVectorsPerLane; ++u) {
        if (u * 32 + lane < vectors) v[u] = buffer[u * 32 + lane];
      }
      accumulate<Element>(acc, v);
      __syncwarp();  // every lane has read the buffer before it is refilled
      ++consumed;
      if (producer.issue(issued)) ++issued;
    }
    store_segment<Element>(p, static_cast<int32_t>(item / segments),
                           static_cast<int64_t>(segment) * kReduceSegmentBytes, vectors, acc, lane);
  }
}
#endif

// ---- Whole rows, warp-specialised (CombineLaunch::pull_rows) ----
// The first P warps produce (P = CombineLaunch::pull_producers, 1 to 4):
// producer j walks the block's tokens t0 + j, t0 + j + P, ... and, for each,
// the ranks holding a partial in ascending order, two at a time: its lane 0
// issues one bulk copy of each of the two whole partial rows into the two
// halves of the next buffer of its own ring of row_stages_that_fit / P
// buffers, both completing on the buffer's one barrier (a token with no
// partial gets an empty step, its output is zeros).  The other warps consume,
// token by token in order, each token from its producer's ring: each thread
// owns a few 16-byte vectors of the row, adds the buffer's vectors (the lower
// rank's half first) into fp32 sums, releases the buffer and stores the output
// row after the token's last partial.  Two partials per step halve the waits,
// releases and step records per row: at 2 ranks, one step per token (v18).  Large copies and no
// bookkeeping between a copy and the next are what let a few SMs keep the link
// busy (docs/latency_budget.md, "Per-SM bandwidth"); several producers issue
// several streams of copies, as the probe's 170 GB/s per SM did.
// The schedule (which tokens, buffers, phases and slot buffers each producer
// uses) is PullRowsSchedule (pull_rows_schedule.h), model-checked on the host.
// The producers read the token slots (which rank holds each partial) a batch
// of tokens at a time, one batch ahead, into two shared buffers each (the
// per-token load was measured not to be the limit, but it costs nothing off the
// critical path).
constexpr int kRowVectorsPerThread = 3;  // 12 consumer warps x 32 x 3 x 16 B >= 16 KiB
// Shared memory: the barriers, step records and slot buffers first (sized
// for kRowMaxStages), then the row buffers (row_stages_that_fit of them).
constexpr size_t kRowFixedBytes =
    2 * kRowMaxStages * sizeof(uint64_t) + kRowMaxStages * sizeof(int2) + kSlotRegionInts * sizeof(int32_t);
constexpr size_t kRowSharedBytes = kRowFixedBytes + kRowBufferBytes;
static_assert(kRowFixedBytes % kRowStageAlign == 0, "the row buffers start aligned");
static_assert(kSlotBatchInts / kRowMaxProducers >= kMaxWorldSize, "a batch holds at least one token's slots");
static_assert((kBlockThreads - 32 * kRowMaxProducers) * kRowVectorsPerThread * 16 >= kRowMaxBytes,
              "every vector of a row has a consumer thread");

// A step carries one or two partial rows of its token (kRowPair: two, the
// lower rank's in the buffer's first half), or none (kRowEmpty).
enum RowStepFlags : int32_t { kRowLast = 1, kRowEmpty = 2, kRowPair = 4 };

struct RowStages {
  uint64_t* full;   // [kRowMaxStages]: the copy (or the empty step) landed
  uint64_t* empty;  // [kRowMaxStages]: the consumers have read the buffer
  int2* steps;      // [kRowMaxStages]: {token, RowStepFlags}
  int32_t* slots;   // kSlotRegionInts: each producer's two slot buffers (PullRowsSchedule)
  char* buffers;    // [plan.stages()][2][stage_bytes]; producer j's ring is [j * ring, (j + 1) * ring)
  int stage_bytes;  // one row
  PullRowsSchedule plan;
  int consumers;
  __device__ RowStages(char* shared, int requested_producers, int row_bytes)
      : full(reinterpret_cast<uint64_t*>(shared)),
        empty(full + kRowMaxStages),
        steps(reinterpret_cast<int2*>(empty + kRowMaxStages)),
        slots(reinterpret_cast<int32_t*>(steps + kRowMaxStages)),
        buffers(shared + kRowFixedBytes),
        stage_bytes(row_stage_bytes(row_bytes)),
        plan(PullRowsSchedule::make(requested_producers, row_stages_that_fit(row_bytes))),
        consumers(kBlockThreads - 32 * plan.producers) {}
  __device__ char* buffer(int stage) const { return buffers + static_cast<size_t>(stage) * 2 * stage_bytes; }
};

// Measurement builds only (-DMOE_EP_DIAGNOSTICS, scripts/gpu): parts of
// the whole-row pull switched off to time the rest; results are then wrong.
enum PullDiagnostic : int32_t { kDiagNoAdds = 1, kDiagNoStores = 2, kDiagNoCopies = 4 };
__device__ __forceinline__ int32_t pull_diagnostic(const CombineParams& p) {
#ifdef MOE_EP_DIAGNOSTICS
  return p.args.pull_diagnostic;
#else
  (void)p;
  return 0;
#endif
}

bool __device__ __forceinline__ pull_rows_applies(const CombineParams& p) {
  return p.args.pull_rows != 0 && combine_rows_aligned(p) && p.ctx.shape.combine_row_bytes <= kRowMaxBytes;
}

#ifdef MOE_EP_HAVE_BULK_COPY
// Producer warp j.  Its k-th step uses buffer plan.stage(j, k); before a
// buffer's second and later uses its previous use must have been released.
__device__ bool produce_rows(const CombineParams& p, const RowStages& st, int j, int32_t t0, int32_t t1) {
  const KernelContext& c = p.ctx;
  const int lane = threadIdx.x % 32;
  const int world = c.shape.world_size;
  const uint32_t bytes = static_cast<uint32_t>(c.shape.combine_row_bytes);
  const uint32_t chunk = p.args.pull_copy_bytes >= 16 ? static_cast<uint32_t>(p.args.pull_copy_bytes) / 16 * 16 : bytes;
  const int32_t* slots = c.local<int32_t>(c.offsets.token_slots);
  const PullRowsSchedule& plan = st.plan;
  uint32_t k = 0;
  PullRowsSchedule::Position at = plan.start(j);  // step k's buffer and use
  // One step: the rows src0 and, when not null, src1 (the next higher rank's)
  // into the next buffer, both copies completing on its one barrier.
  auto emit = [&](int32_t token, int32_t flags, const char* src0, const char* src1) -> bool {
    const int stage = at.stage;
    const uint32_t use = at.use;
    const bool released = use == 0 || barrier_wait(st.empty + stage, (use - 1) & 1u, c.state.timeout_ns);
    if (!__all_sync(0xFFFFFFFFu, released)) return false;  // warp-uniform, for the shuffles that follow
    if (lane == 0) {
      st.steps[stage] = make_int2(token, flags | (src1 != nullptr ? kRowPair : 0));
      if (src0 != nullptr && (pull_diagnostic(p) & kDiagNoCopies) == 0) {
        fence_shared_before_bulk_copy();  // measured at about 2% on 8-24 SMs, kept: it is what the proxy rules ask
        barrier_expect_bytes(st.full + stage, src1 != nullptr ? 2 * bytes : bytes);
        bulk_copy_chunks_issue(st.buffer(stage), src0, bytes, chunk, st.full + stage);
        if (src1 != nullptr)
          bulk_copy_chunks_issue(st.buffer(stage) + st.stage_bytes, src1, bytes, chunk, st.full + stage);
      } else {
        barrier_arrive(st.full + stage);
      }
    }
    __syncwarp();
    ++k;
    at = plan.next(j, at);
    return true;
  };
  // After a failed wait: every row copy this producer issued lands before it
  // leaves (a block must not end while a copy still writes its shared
  // memory); the copies read mapped memory, so they complete, and each wait
  // is bounded anyway.
  auto drain_row_copies = [&]() {
    for (uint32_t r = 0; r < static_cast<uint32_t>(plan.ring) && r < k; ++r) {
      const uint32_t last = r + (k - 1 - r) / plan.ring * plan.ring;  // the buffer's last step
      barrier_wait(st.full + plan.stage(j, last), plan.parity(last), c.state.timeout_ns);
    }
  };
  // This producer's n-th token is plan.token(j, n, t0), for n < count.
  // Tokens [first, first + batch) of that sequence have their slots in one of
  // the producer's two slot buffers; the lanes fetch the next batch with
  // asynchronous 4-byte copies while lane 0 issues the current batch's row
  // copies.
  const int32_t count = plan.tokens_of(j, t0, t1);
  const int32_t batch = plan.slot_batch(world);
  auto token_of = [&](int32_t n) { return plan.token(j, n, t0); };
  auto fetch = [&](int32_t first, int buffer) {
    const int32_t ints = max(0, min(batch, count - first)) * world;
    int32_t* dst = st.slots + plan.slot_buffer_offset(j, buffer);
    for (int32_t i = lane; i < ints; i += 32) {
      copy_async_4_to_shared(dst + i, slots + static_cast<int64_t>(token_of(first + i / world)) * world + i % world);
    }
    copy_async_commit();
  };
  if (lane == 0) fence_global_before_bulk_copies();  // the handshake's acquires
  fetch(0, 0);
  int buffer = 0;
  for (int32_t first = 0; first < count; first += batch, buffer ^= 1) {
    fetch(first + batch, buffer ^ 1);
    copy_async_wait_all_but_newest();
    __syncwarp();  // every lane's part of this batch landed
    const int32_t* cached = st.slots + plan.slot_buffer_offset(j, buffer);
    const int32_t last = min(first + batch, count);
    for (int32_t n = first; n < last; ++n) {
      const int32_t t = token_of(n);
      const TokenDestinations srcs = TokenDestinations::load(cached + (n - first) * world, world, lane);
      uint64_t rest = srcs.mask;
      bool ok = rest != 0 || emit(t, kRowLast | kRowEmpty, nullptr, nullptr);
      while (rest != 0) {  // the partials two at a time, in ascending rank order
        const int q0 = lowest_rank(rest);
        rest &= rest - 1;
        const char* src0 = partial_row(p, q0, srcs.slot(q0));  // every lane
        const char* src1 = nullptr;
        if (rest != 0) {
          const int q1 = lowest_rank(rest);
          rest &= rest - 1;
          src1 = partial_row(p, q1, srcs.slot(q1));
        }
        ok = ok && emit(t, rest == 0 ? kRowLast : 0, src0, src1);
      }
      if (!ok) {
        copy_async_drain();
        drain_row_copies();
        return false;
      }
    }
    __syncwarp();  // every lane read this batch before the next iteration's fetch overwrites it
  }
  copy_async_drain();
  drain_row_copies();  // the consumers may still time out: no copy may outlive the block
  return true;
}

// The next position in each of up to kProducers producer rings, kept in
// registers (indexed with constants only: a runtime index would put the array
// in local memory; sized for the block's producers, since every slot costs
// selects per token).
template <int kProducers>
struct RingCursors {
  PullRowsSchedule::Position c[kProducers];
  __device__ explicit RingCursors(const PullRowsSchedule& plan) {
#pragma unroll
    for (int x = 0; x < kProducers; ++x) c[x] = plan.start(x);
  }
  __device__ PullRowsSchedule::Position get(int j) const {
    PullRowsSchedule::Position r = c[0];
#pragma unroll
    for (int x = 1; x < kProducers; ++x) r = j == x ? c[x] : r;
    return r;
  }
  __device__ void set(int j, PullRowsSchedule::Position v) {
#pragma unroll
    for (int x = 0; x < kProducers; ++x) c[x] = j == x ? v : c[x];
  }
};

// A token whose one step holds all its partials (at most two: every token at
// 2 ranks), 16-bit formats: the output row straight from the packed sums
// (Element::sum_two, v22), the empty step as zeros; a vector with a NaN
// result is recomputed in fp32 as the multi-step path does.  Releases the
// buffer before the stores, as that path does.  `diagnostic`
// (PullDiagnostic, measurement builds only) kDiagNoAdds: no loads or sums.
template <typename Element, int kVectors>
__device__ void consume_single_step(const RowStages& st, int stage, int2 step, int i, int vectors,
                                    int32_t diagnostic, uint4 (&out)[kVectors]) {
  constexpr int kPer = 16 / sizeof(typename Element::Bits);
  const uint4* row = reinterpret_cast<const uint4*>(st.buffer(stage));
  const uint4* row1 = reinterpret_cast<const uint4*>(st.buffer(stage) + st.stage_bytes);
  const bool empty = (step.y & kRowEmpty) != 0 || (diagnostic & kDiagNoAdds) != 0;
  const bool pair = (step.y & kRowPair) != 0;
  uint4 x0[kVectors], x1[kVectors];
#pragma unroll
  for (int u = 0; u < kVectors; ++u) {
    const int v = i + u * st.consumers;
    x0[u] = make_uint4(0u, 0u, 0u, 0u);
    x1[u] = make_uint4(0u, 0u, 0u, 0u);
    if (!empty && (u < kVectors - 1 || v < vectors)) {
      x0[u] = row[v];
      if (pair) x1[u] = row1[v];
    }
  }
  barrier_arrive(st.empty + stage);  // this thread's reads of the buffer and the step are done
  uint32_t nan = 0;
#pragma unroll
  for (int u = 0; u < kVectors; ++u) out[u] = Element::sum_two(x0[u], x1[u], nan);
  if (nan != 0) {  // rare: the fp32 path keeps NaN payloads as the host does
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
      float acc[kPer];
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[e] = 0.0f;
      Element::add_vector(acc, x0[u]);
      Element::add_vector(acc, x1[u]);  // +0 when there is no second partial: 0 + a + 0 = 0 + a
      out[u] = Element::store_vector(acc);
    }
  }
}

// Consumer thread i (0 .. st.consumers - 1) owns vectors i, i + consumers, ...
// of a row, kVectors of them at most (the fewest that cover the row: only
// the last can fall past its end, so only the last is tested), for up to
// kProducers producers (at least plan.producers).  Tokens are
// taken in order, token t from producer (t - t0) % P, whose steps for it run
// until the one flagged kRowLast.
template <typename Element, int kVectors, int kProducers>
__device__ bool consume_rows(const CombineParams& p, const RowStages& st, int32_t t0, int32_t t1) {
  using Bits = typename Element::Bits;
  constexpr int kPer = 16 / sizeof(Bits);
  const KernelContext& c = p.ctx;
  const PullRowsSchedule& plan = st.plan;
  const int i = static_cast<int>(threadIdx.x) - 32 * plan.producers;
  const int vectors = static_cast<int>(c.shape.combine_row_bytes / 16);
  RingCursors<kProducers> taken(plan);  // the next step of each producer's ring
  int j = 0;                // producer of token t: plan.producer_of(t, t0), kept without a division
  for (int32_t t = t0; t < t1; ++t, j = j + 1 == plan.producers ? 0 : j + 1) {
    PullRowsSchedule::Position at = taken.get(j);
    uint4* out = reinterpret_cast<uint4*>(static_cast<char*>(p.args.output) +
                                          static_cast<int64_t>(t) * c.shape.combine_row_bytes);
    if (!barrier_wait(st.full + at.stage, at.parity(), c.state.timeout_ns)) return false;
    if constexpr (Element::kSumsTwo) {
      const int2 first = st.steps[at.stage];
      if (first.y & kRowLast) {
        uint4 sums[kVectors];
        consume_single_step<Element, kVectors>(st, at.stage, first, i, vectors, pull_diagnostic(p), sums);
        taken.set(j, plan.next(j, at));
        if (pull_diagnostic(p) & kDiagNoStores) continue;
#pragma unroll
        for (int u = 0; u < kVectors; ++u) {
          const int v = i + u * st.consumers;
          if (u < kVectors - 1 || v < vectors) out[v] = sums[u];
        }
        continue;
      }
    }
    float acc[kVectors][kPer];
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
#pragma unroll
      for (int e = 0; e < kPer; ++e) acc[u][e] = 0.0f;
    }
    // The first step's barrier was waited for above.
    for (bool waited = true;; at = plan.next(j, at), waited = false) {
      const int stage = at.stage;
      if (!waited && !barrier_wait(st.full + stage, at.parity(), c.state.timeout_ns)) return false;
      const int2 step = st.steps[stage];
      if (!(step.y & kRowEmpty) && (pull_diagnostic(p) & kDiagNoAdds) == 0) {
        // Both rows' loads first (four or six 16-byte loads in flight), then
        // the adds in rank order: the lower rank's row, then the higher's.
        const uint4* row = reinterpret_cast<const uint4*>(st.buffer(stage));
        const uint4* row1 = reinterpret_cast<const uint4*>(st.buffer(stage) + st.stage_bytes);
        const bool pair = (step.y & kRowPair) != 0;
        uint4 x0[kVectors], x1[kVectors];
#pragma unroll
        for (int u = 0; u < kVectors; ++u) {
          const int v = i + u * st.consumers;
          if (u < kVectors - 1 || v < vectors) {
            x0[u] = row[v];
            if (pair) x1[u] = row1[v];
          }
        }
#pragma unroll
        for (int u = 0; u < kVectors; ++u) {
          const int v = i + u * st.consumers;
          if (u == kVectors - 1 && v >= vectors) continue;
          Element::add_vector(acc[u], x0[u]);
          if (pair) Element::add_vector(acc[u], x1[u]);
        }
      }
      // Every consumer thread arrives (the barrier counts st.consumers): each
      // releases its own reads of the buffer and of the step, which is what
      // the barrier's release semantics cover (and what compute-sanitizer's
      // racecheck checks; one arrival per warp after a __syncwarp is flagged:
      // scripts/gpu/mbarrier_release_probe.cu; v18: the consumers meeting at a
      // named barrier and one of them arriving measured 17 % slower on 16 SMs,
      // and racecheck flags it).
      barrier_arrive(st.empty + stage);
      if (step.y & kRowLast) break;
    }
    taken.set(j, plan.next(j, at));
    if (pull_diagnostic(p) & kDiagNoStores) continue;
#pragma unroll
    for (int u = 0; u < kVectors; ++u) {
      const int v = i + u * st.consumers;
      if (u < kVectors - 1 || v < vectors) out[v] = Element::store_vector(acc[u]);
    }
  }
  return true;
}

// consume_rows with the fewest vectors per thread that cover the row (its
// bounds test relies on it).
template <typename Element, int kProducers>
__device__ bool consume_rows_for_row(const CombineParams& p, const RowStages& st, int32_t t0, int32_t t1, int vectors) {
  if (vectors <= st.consumers) return consume_rows<Element, 1, kProducers>(p, st, t0, t1);
  if (vectors <= 2 * st.consumers) return consume_rows<Element, 2, kProducers>(p, st, t0, t1);
  return consume_rows<Element, kRowVectorsPerThread, kProducers>(p, st, t0, t1);
}

template <typename Element>
__device__ void pull_reduce_whole_rows(const CombineParams& p, char* shared) {
  const KernelContext& c = p.ctx;
  const RowStages st(shared, p.args.pull_producers, static_cast<int>(c.shape.combine_row_bytes));
  if (threadIdx.x == 0) {
    for (int s = 0; s < st.plan.stages(); ++s) {
      barrier_init(st.full + s, 1);
      barrier_init(st.empty + s, static_cast<uint32_t>(st.consumers));
    }
    barrier_init_fence();
  }
  __syncthreads();
  const int64_t tokens = p.args.num_tokens;
  const int64_t per_block = (tokens + gridDim.x - 1) / gridDim.x;
  const int64_t begin = per_block * blockIdx.x;
  const int32_t t0 = static_cast<int32_t>(begin < tokens ? begin : tokens);
  const int32_t t1 = static_cast<int32_t>(begin + per_block < tokens ? begin + per_block : tokens);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const int vectors = static_cast<int>(c.shape.combine_row_bytes / 16);
  bool ok;
  if (warp < st.plan.producers) {
    ok = produce_rows(p, st, warp, t0, t1);
  } else if (st.plan.producers <= 2) {
    ok = consume_rows_for_row<Element, 2>(p, st, t0, t1, vectors);
  } else {
    ok = consume_rows_for_row<Element, kRowMaxProducers>(p, st, t0, t1, vectors);
  }
  // Every failing thread records (consumers fail one by one: a thread whose
  // part of a row was not stored must not go unreported).
  if (!ok) record_timeout(c.control(), c.state.mirror, kPhaseCombine, -1);
}
#endif

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
__device__ void handshake(const KernelContext& c, uint64_t epoch, bool announces, int32_t* failed) {
  const GroupShape& s = c.shape;
  if (announces) {
    for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
      if (q != s.rank) store_release_sys(c.remote<uint64_t>(q, c.offsets.combine_started) + s.rank, epoch);
    }
  }
  for (int q = threadIdx.x; q < s.world_size; q += blockDim.x) {
    if (q == s.rank) continue;
    if (!wait_until_at_least(c.local<uint64_t>(c.offsets.combine_started) + q, epoch, c.control(), c.state.mirror,
                             c.state.timeout_ns, kPhaseCombine, q)) {
      *failed = 1;
    }
  }
}

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
  __syncthreads();
  if (timed_out != kPhaseNone) return;  // block-uniform
  handshake(c, epoch, blockIdx.x == 0, &failed);
  __syncthreads();  // the waiters' acquires order every thread's reads of the peers' views
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
  static std::atomic<uint64_t> raised_on_devices{0};
  const cudaError_t e = raise_dynamic_shared_limit_once(combine_pull_kernel, kPullSharedBytes, &raised_on_devices);
  if (e != cudaSuccess) return e;
  return launch_kernel(combine_pull_kernel, p.args.num_blocks, kBlockThreads, kPullSharedBytes, stream, p.args.pdl, p);
}

}  // namespace kernels
}  // namespace moe_ep
