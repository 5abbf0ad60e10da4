// Where the NCCL backend's buffers live inside its one device allocation, and
// how big that allocation is (moe_ep_workspace_size reports the same number).
// The allocation holds one copy of the plan per buffer slot
// (config->micro_batches), slot k at k x total_bytes: a slot has its own
// results, send segments, combine rows, routing scratch and error record, so
// two micro-batches in flight never share a byte.
#pragma once

#include <cstdint>

#include "gpu/expert_rows_plan.hpp"
#include "nccl_kernels.h"
#include "params.hpp"

namespace moe_ep {

struct NcclWorkspacePlan {
  // Byte offsets of every kernels::NcclBuffers field, in field order.
  uint64_t recv_hidden, recv_scales, recv_ids, recv_weights, recv_tokens, recv_meta, recv_counts, local_expert_counts,
      eplb_gathered, send_segments, local_slots, token_slots, chunk_offsets, dest_rows, expert_hist, route_done, errors,
      masked_ranks, combine_in, combine_out;
  // Bytes between two ranks' metadata blocks in recv_meta
  // (kernels::nccl_meta_stride), the room kept for one block before and after
  // the receive rows (kernels::nccl_meta_gap), and the distance between two
  // send segments (kernels::nccl_send_segment_stride).
  uint64_t meta_stride, meta_gap, send_segment_stride;
  // The zero-copy combine input region (config->zero_copy_combine; 0 bytes
  // otherwise, last so that every other offset stays what it was).  With the
  // workspace registered with NCCL, combine's sends always read it (a
  // caller's other expert_output is copied there first); unregistered, they
  // read the caller's expert_output wherever it is.
  uint64_t combine_input;
  // The expert layouts (layout.expert_layout(); 0 bytes and unused for
  // RANK_MAJOR, placed after combine_input so that a rank-major plan is what
  // it was): recv_tokens above (each received row's source token index, which
  // the expansion writes into row_sources), the expert layout's results and
  // private state (gpu/expert_rows_plan.hpp), and the rank-major rows combine
  // folds the caller's expert output into before sending them
  // ([world x max_tpr][combine_row_bytes]).
  ExpertRowsOffsets expert;
  uint64_t expert_combine_rows;
  // The FP8 wire (0 bytes each where its wire is AS_IS, placed last so that
  // an AS_IS plan is what it was).  Dispatch: the caller's rows quantized
  // before they are packed, codes [max_tpr][hidden_row_elems] and scales
  // [max_tpr][wire_scale_row_elems] fp32 (wire_codes, wire_scales), and with
  // dispatch_dequantize the received rows back in hidden_dtype
  // ([world x max_tpr][hidden_row_bytes], dequantized).  Combine: the
  // quantized rows this rank sends, its own included
  // ([world x max_tpr][kernels::nccl_combine_wire_row_bytes], combine_wire).
  uint64_t wire_codes, wire_scales, dequantized, combine_wire;
  uint64_t total_bytes;
};

// The FP8 wire's buffers of one slot (NULL where the wire is AS_IS).
struct NcclWireBuffers {
  uint8_t* codes;
  float* scales;
  char* dequantized;
  char* combine_rows;
};

// The kernels' view of the group: group_shape of the rows as dispatch moves
// them (wire_layout: an FP8 dispatch wire's codes and fp32 scales), source
// token indices in the metadata blocks exactly for the expert layouts, and
// the combine wire.
kernels::NcclShape nccl_shape(const Layout& layout);

// One slot's plan, placed by common/region_planner.hpp.  Throws
// INVALID_ARGUMENT when a size overflows 64 bits.
NcclWorkspacePlan plan_nccl_workspace(const Layout& layout);

// The whole allocation: `slots` x plan.total_bytes (a 256-byte multiple, so
// every slot starts as aligned as slot 0).  Throws INVALID_ARGUMENT on
// overflow, INTERNAL for fewer than 1 slot.
uint64_t nccl_workspace_total(const NcclWorkspacePlan& plan, int32_t slots);

// The buffers of an allocation at `base` (NULL for absent ones).
kernels::NcclBuffers nccl_buffers_at(char* base, const NcclWorkspacePlan& plan, const Layout& layout);
// The expert layout's buffers of an allocation at `base` (all NULL for RANK_MAJOR).
kernels::ExpertRowsBuffers nccl_expert_rows_at(char* base, const NcclWorkspacePlan& plan, const Layout& layout);
// The FP8 wire's buffers of an allocation at `base`.
NcclWireBuffers nccl_wire_buffers_at(char* base, const NcclWorkspacePlan& plan, const Layout& layout);

}  // namespace moe_ep
