// The pull's whole-row path, warp-specialised: producer warps bring whole
// partial rows into shared memory with bulk copies, the other warps add them.
//
// Part of the pull kernel's one translation unit (combine/pull.cu): device
// code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "combine/common.cuh"
#include "combine/pull_diagnostics.cuh"
#include "combine/pull_rows_schedule.h"
#include "combine/reduce.cuh"
#include "common/bulk_copy.cuh"
#include "common/device_sync.cuh"
#include "common/kernel_common.cuh"

namespace moe_ep {
namespace kernels {
namespace {

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
// releases and step records per row: at 2 ranks, one step per token.  Large copies and no
// bookkeeping between a copy and the next are what let a few SMs keep the link
// busy (docs/latency_budget.md, "Per-SM bandwidth"); several producers issue
// several streams of copies per SM.
// The schedule (which tokens, buffers, phases and slot buffers each producer
// uses) is PullRowsSchedule (combine/pull_rows_schedule.h), model-checked on the host.
// The producers read the token slots (which rank holds each partial) a batch
// of tokens at a time, one batch ahead, into two shared buffers each (the
// per-token load is not the limit, but off the critical path it costs
// nothing).
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
        fence_shared_before_bulk_copy();  // the proxy rules ask for it
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
// (Element::sum_two), the empty step as zeros; a vector with a NaN
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
      // racecheck checks: it flags one arrival per warp after a __syncwarp,
      // and one arrival after the consumers meet at a named barrier, which is
      // also slower).
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

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
