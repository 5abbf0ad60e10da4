// The device side of the NCCL backend (src/nccl), behind the same kind of
// plain launch interface as the NVLink kernels: structs of pointers and
// integers, launch functions returning cudaError_t.  NCCL itself moves the
// bytes between these kernels; nothing here touches another GPU's memory.
//
// One dispatch = route (with the scan, one launch) -> pack -> (NCCL grouped
// send/recv) -> finish; one combine = (NCCL grouped send/recv) -> reduce.
// Either can be cut into row ranges whose pack / reduction overlaps the
// transfer of the next range (src/nccl/nccl_chunk_plan.hpp).  docs/nccl_backend.md.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/host_device.h"
#include "moe_ep_kernels.h"
#include "wire_kernels.h"

namespace moe_ep {
namespace kernels {

// Tokens per routing chunk (one block of the route kernel).
constexpr int32_t kNcclRouteChunk = kBlockThreads;

// The NCCL backend's view of a group: the shape every GPU kernel shares, and
// whether each metadata block also carries its rows' source token indices
// (the expert layouts read them when they expand the receive into expert rows;
// a rank-major group sends none of those bytes).
struct NcclShape : GroupShape {
  int32_t source_tokens;  // nonzero: every metadata block holds [tpr] int32 token indices
  int32_t fp8_combine;    // nonzero: combine moves FP8 wire rows (nccl_combine_wire_row_bytes)
};

// int32 fields of the header every rank sends every rank with a dispatch:
// [0] kNcclHeaderTag, [1] the sender's tokens_per_rank, [2] its row count for
// the receiver, [3, 3+epr) its picks per expert of the receiver, then (EPLB on)
// its per-expert statistics row [E].  The tag tells a header from other bytes
// (row data) that a mismatched transfer might leave where the receiver looks.
constexpr int32_t kNcclHeaderFixed = 3;
constexpr int32_t kNcclHeaderTag = 0x4E45504D;  // "MPEN"
MOE_EP_HOST_DEVICE int32_t nccl_header_ints(const NcclShape& s) {
  return kNcclHeaderFixed + s.experts_per_rank + (s.eplb_enabled ? s.num_experts : 0);
}

MOE_EP_HOST_DEVICE int64_t nccl_round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The metadata of one segment of tpr rows, contiguous so that one NCCL send
// moves it (every extra send or receive in a group costs NCCL a few us):
//   [header][ids: tpr x top_k int32][weights: tpr x top_k float]
//   [tokens: tpr int32, source_tokens only][scales: tpr rows]
// (the tokens before the scales: scale rows need not be 4-byte multiples).
MOE_EP_HOST_DEVICE int64_t nccl_meta_ids_offset(const NcclShape& s) {
  return static_cast<int64_t>(nccl_header_ints(s)) * 4;
}
MOE_EP_HOST_DEVICE int64_t nccl_meta_weights_offset(const NcclShape& s, int64_t tpr) {
  return nccl_meta_ids_offset(s) + tpr * s.top_k * 4;
}
MOE_EP_HOST_DEVICE int64_t nccl_meta_tokens_offset(const NcclShape& s, int64_t tpr) {
  return nccl_meta_ids_offset(s) + tpr * s.top_k * 8;
}
MOE_EP_HOST_DEVICE int64_t nccl_meta_scales_offset(const NcclShape& s, int64_t tpr) {
  return nccl_meta_tokens_offset(s, tpr) + (s.source_tokens ? tpr * 4 : 0);
}
MOE_EP_HOST_DEVICE int64_t nccl_meta_bytes(const NcclShape& s, int64_t tpr) {
  return nccl_meta_scales_offset(s, tpr) + tpr * s.scale_row_bytes;
}
// The block rounded up to 16 bytes.
MOE_EP_HOST_DEVICE int64_t nccl_meta_span(const NcclShape& s, int64_t tpr) {
  return nccl_round_up(nccl_meta_bytes(s, tpr), 16);
}
// What a block placed before rows occupies: rounded up to 256 bytes, so that
// the [block | rows] operation starts as aligned as the rows (a start aligned
// to 16 bytes only makes that rank's transfer slower).
MOE_EP_HOST_DEVICE int64_t nccl_meta_lead(const NcclShape& s, int64_t tpr) {
  return nccl_round_up(nccl_meta_bytes(s, tpr), 256);
}
// Distance between two ranks' blocks in recv_meta (16-byte multiple).  The
// host checks every product here for overflow when it plans the workspace.
MOE_EP_HOST_DEVICE int64_t nccl_meta_stride(const NcclShape& s) { return nccl_meta_span(s, s.max_tokens_per_rank); }
// Room for one block at max_tokens_per_rank, 256-byte multiple: kept before
// and after the receive rows and in every send segment.
MOE_EP_HOST_DEVICE int64_t nccl_meta_gap(const NcclShape& s) {
  return nccl_round_up(nccl_meta_bytes(s, s.max_tokens_per_rank), 256);
}

// Where a source's metadata block travels (docs/nccl_backend.md, "One
// operation per peer").  The receive rows are rank-major and contiguous, so a
// block can ride in the same NCCL operation as its segment's rows only where
// the segment borders free space: source 0's segment opens the receive rows
// (its block goes just before them: [block | rows]), source world-1's closes
// them (its block goes just after the world x tpr rows: [rows | block]).  The
// blocks of the other sources go to recv_meta in an operation of their own.
// A send segment has the same shape as what its receiver expects: source
// world-1 keeps its block after its rows, every other source before them.
MOE_EP_HOST_DEVICE bool nccl_meta_after_rows(const NcclShape& s, int src) { return src == s.world_size - 1; }
// Whether source src's block and rows are one operation: it borders the
// receive rows, and rows are 16-byte multiples (a block after rows then
// starts exactly at their end, aligned for its int32 fields).
MOE_EP_HOST_DEVICE bool nccl_meta_joins_rows(const NcclShape& s, int src) {
  return s.hidden_row_bytes % 16 == 0 && (src == 0 || src == s.world_size - 1);
}
// Distance between two destinations' send segments: the gap and
// max_tokens_per_rank rows (16-byte rounded), 256-byte multiple.
MOE_EP_HOST_DEVICE int64_t nccl_send_segment_stride(const NcclShape& s) {
  return nccl_round_up(
      nccl_round_up(static_cast<int64_t>(s.max_tokens_per_rank) * s.hidden_row_bytes, 16) + nccl_meta_gap(s), 256);
}
// Inside this rank's send segment (for any destination): its rows and its block.
MOE_EP_HOST_DEVICE int64_t nccl_send_rows_offset(const NcclShape& s) {
  return nccl_meta_after_rows(s, s.rank) ? 0 : nccl_meta_gap(s);
}
MOE_EP_HOST_DEVICE int64_t nccl_send_meta_offset(const NcclShape& s, int64_t tpr) {
  return nccl_meta_after_rows(s, s.rank) ? nccl_round_up(tpr * s.hidden_row_bytes, 16)
                                         : nccl_meta_gap(s) - nccl_meta_lead(s, tpr);
}
// Where the block received from source src lands, relative to recv_hidden
// (src 0: just before the rows; src world-1: just after the world x tpr
// rows), or -1 when it lands in recv_meta (the other sources, and this
// rank's own header).
MOE_EP_HOST_DEVICE int64_t nccl_recv_meta_offset(const NcclShape& s, int src, int64_t tpr) {
  if (src == s.rank) return -1;
  if (src == 0) return -nccl_meta_lead(s, tpr);
  if (src == s.world_size - 1) return nccl_round_up(s.world_size * tpr * s.hidden_row_bytes, 16);
  return -1;
}

// An FP8 combine wire's row (docs/nccl_backend.md, "The FP8 wire"): the
// hidden_size e4m3fn codes, 16-byte rounded, then the ceil(hidden_size / 128)
// fp32 block scales, 16-byte rounded, so that every row NCCL moves starts
// 16-byte aligned in a rank-major [world][tpr] segment.
MOE_EP_HOST_DEVICE int64_t nccl_combine_wire_scales_offset(const NcclShape& s) {
  return wire_transfer_scales_offset(s.hidden_size);
}
MOE_EP_HOST_DEVICE int64_t nccl_combine_wire_row_bytes(const NcclShape& s) {
  return wire_transfer_row_bytes(s.hidden_size);
}
// Bytes of one row as combine moves it: a wire row, or a combine_dtype row.
MOE_EP_HOST_DEVICE int64_t nccl_combine_transfer_row_bytes(const NcclShape& s) {
  return s.fp8_combine ? nccl_combine_wire_row_bytes(s) : s.combine_row_bytes;
}

// Errors the kernels record (device memory, atomics); the host reads and
// clears them in poll_async_error.
struct NcclDeviceErrors {
  uint32_t bad_id_count;      // picks outside [0, E) that are not the invalid id
  uint32_t bad_peer_count;    // received headers that failed the checks
  uint64_t bad_id_first;      // min of (token*top_k + pick) << 32 | (uint32)id; UINT64_MAX when none
  int32_t bad_peer_first;     // lowest rank whose header failed; INT32_MAX when none
  int32_t bad_peer_tpr;       // what that rank claimed: tokens_per_rank
  int32_t bad_peer_rows;      //                          and rows
  int32_t reserved;
};

// Device memory of one handle (cudaMalloc'd by src/nccl; sized for
// max_tokens_per_rank; a call with tokens_per_rank = tpr uses segments of tpr rows).
struct NcclBuffers {
  // Results (receive side), rank-major [world][tpr] rows.
  char* recv_hidden;           // with nccl_meta_gap bytes before it and after its W x max rows
  char* recv_scales;           // NULL without scales
  int32_t* recv_ids;
  float* recv_weights;
  int32_t* recv_tokens;        // [world][max_tpr]: each received row's token index on its source (rows past
                               // recv_counts are never read); NULL unless source_tokens
  char* recv_meta;             // [world][meta stride]: what each source sent (own: header only)
  int32_t* recv_counts;        // [world]
  int32_t* local_expert_counts;// [experts_per_rank]
  int32_t* eplb_gathered;      // [world][E], NULL when EPLB is off
  // Send side, one segment per destination at nccl_send_segment_stride:
  // tpr rows and the metadata block, placed as nccl_send_*_offset say (own
  // segment unused: the pack kernel writes this rank's own rows straight
  // into the results).
  char* send_segments;
  // Private.  Slots are [max_tpr][world], -1 where the token is not sent.
  int32_t* local_slots;        // the token's slot among its route chunk's tokens bound to each rank
  int32_t* token_slots;        // its slot in each rank's segment (kept for combine)
  int32_t* chunk_offsets;      // [chunks][world]: rows per route chunk, then (scan) exclusive prefix
  int32_t* dest_rows;          // [world]: rows this rank sends each rank
  int32_t* expert_hist;        // [E]: this call's valid picks per expert (zero between calls)
  uint32_t* route_done;        // route blocks finished in this call (zero between calls)
  NcclDeviceErrors* errors;
  // The active-rank mask as routing reads it: bit r set drops the picks of
  // rank r's experts; every bit set (this rank inactive) drops them all.
  // Device memory read at run time, so a captured graph follows a new mask.
  const uint64_t* masked_ranks;
  char* combine_in;            // [world][max_tpr][nccl_combine_transfer_row_bytes]
  char* combine_out;           // [max_tpr][combine_row_bytes]: library-owned output
};

struct NcclDispatchLaunch {
  int32_t num_tokens;
  int32_t tokens_per_rank;
  const void* hidden;          // [T, hidden_row_bytes]
  const int32_t* topk_ids;     // [T, top_k]
  const float* topk_weights;   // [T, top_k] or NULL: zeros are sent
  const void* scales;          // [T, scale_row_bytes] or NULL
  const int32_t* eplb_local;   // [E] or NULL: the counted picks are sent
  int32_t max_blocks;          // SM budget of the pack kernel
};

// Which rows a pack launch writes: this rank's own rows (into the results) can
// be packed on a second stream while the peers' rows go to NCCL.
enum NcclPackRows : int32_t { kPackAll = 0, kPackOwn = 1, kPackPeers = 2 };

struct NcclCombineLaunch {
  int32_t num_tokens;
  int32_t tokens_per_rank;
  int32_t token_begin;         // reduce tokens [token_begin, token_end) of [0, num_tokens)
  int32_t token_end;
  const void* expert_output;   // [world*tpr, nccl_combine_transfer_row_bytes]: the own rows
  void* output;                // [T, combine_row_bytes]
  int32_t max_blocks;
};

// Before the NCCL exchange, one launch: routing, and (its last block) the
// scan of the chunk counts and the headers.  Stream-ordered, no host
// synchronisation; leaves expert_hist and route_done zero for the next call.
cudaError_t launch_nccl_dispatch_route(const NcclShape& shape, const NcclBuffers& buffers,
                                       const NcclDispatchLaunch& args, cudaStream_t stream);
// After route: the token slots (kept for combine), rows, rewritten ids,
// weights, source token indices (source_tokens), scales and padding rows into
// the send segments (peers) and the result rows (own), as `rows` selects, for the slots [slot_begin, slot_end)
// of every segment (0 <= slot_begin <= slot_end <= tokens_per_rank, else
// cudaErrorInvalidValue and nothing launched): a pipelined dispatch packs one
// row range while NCCL moves the previous one.
cudaError_t launch_nccl_dispatch_pack(const NcclShape& shape, const NcclBuffers& buffers,
                                      const NcclDispatchLaunch& args, int32_t rows, int32_t slot_begin,
                                      int32_t slot_end, cudaStream_t stream);
// After the NCCL exchange: checks every received header, then recv_counts,
// local_expert_counts and the gathered EPLB statistics (block 0), and moves
// the received ids, weights, source token indices and scales into the result
// rows (every block).
cudaError_t launch_nccl_dispatch_finish(const NcclShape& shape, const NcclBuffers& buffers, int32_t tokens_per_rank,
                                        int32_t max_blocks, cudaStream_t stream);
// After combine's NCCL exchange of the slots the tokens [token_begin,
// token_end) use (a token's slot on any rank is at most its index): the sum
// over ranks in ascending rank order, fp32 accumulation (bitwise equal to the
// HOST backend).  With shape.fp8_combine every row is an FP8 wire row, each
// element its code times its block's scale in fp32 before it is added.
cudaError_t launch_nccl_combine_reduce(const NcclShape& shape, const NcclBuffers& buffers,
                                       const NcclCombineLaunch& args, cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
