// The counts a dispatch sends with its rows (how many rows, the picks per
// expert, the EPLB row) and the check a receiver makes of a source's count.
//
// Part of the dispatch kernels' one translation unit (dispatch/dispatch.cu):
// device code with internal linkage, included there only.
#pragma once

#include <stdint.h>

#include "dispatch/lookback.h"
#include "dispatch/params.cuh"

namespace moe_ep {
namespace kernels {
namespace {

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
  record_peer_count_error(c.control(),
                          PeerCountError{source, source_tokens_per_rank, static_cast<int32_t>(rows), tokens_per_rank});
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
// blocks beyond this grid with this call's tag (dispatch/lookback.h).
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

}  // namespace
}  // namespace kernels
}  // namespace moe_ep
