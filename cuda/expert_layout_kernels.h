// The expert layouts on the GPU (docs/semantics.md, "Receive layouts"),
// behind the same kind of plain launch interface as the backends' kernels.
// Both GPU backends run them around their rank-major exchanges, on the
// receiving rank, in its own memory: a dispatch lands rank-major rows as
// always, then expand_to_expert_rows lays them out one row per (token, local
// pick); a combine first runs reduce_expert_rows, which folds the expert
// output back into one rank-major row per received token, then sends those
// rows as a rank-major combine does.  So the link carries the same bytes in
// every layout.  The results are bitwise those of the HOST backend
// (src/expert_layout.hpp), which defines the order of rows and of the sums.
#pragma once

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// Rank-major rows one warp ranks at a time (a warp tile), and warp tiles per
// block tile (the warps of one block: kBlockThreads / 32).  The walk through a
// tile is serial, so tiles are short: the tile counts they cost are 4 bytes
// per local expert per tile.
constexpr int32_t kExpertTileRows = 8;
constexpr int32_t kExpertTileWarps = 16;
// The fill and the reduction give a warp a segment of a row at a time, not a
// whole row, so that a small batch still spreads over every SM.
constexpr int64_t kExpertSegmentBytes = 1024;

// A group's expert layout: fixed at create, the same in every call.
struct ExpertLayoutShape {
  int32_t world_size;
  int32_t top_k;
  int32_t experts_per_rank;  // E_local
  int32_t first_expert;      // rank * E_local: local expert e is global id first_expert + e
  int32_t max_tokens_per_rank;
  int32_t packed;            // nonzero: EXPERT_PACKED; zero: EXPERT_MAJOR
  int32_t capacity;          // EXPERT_MAJOR: rows per expert
  int32_t alignment;         // EXPERT_PACKED: every expert's first row is a multiple of it
  int32_t rows;              // rows of the layout: E_local * capacity, or expert_rows
  int32_t scale_row_elems;   // scales per row (0: none)
  int32_t scale_columns;     // nonzero: COLUMN_MAJOR fp32 scales (columns of align4 rows)
  int32_t hidden_size;       // elements of a combine row
  int32_t combine_dtype;     // CombineDtype (moe_ep_kernels.h)
  int32_t weighted;          // expert_output_weighted: rows are summed as they are
  int64_t hidden_row_bytes;  // dispatch rows as received
  int64_t scale_row_bytes;
  int64_t combine_row_bytes;
};

// The rank-major receive of one dispatch, as a backend left it (device
// memory): row s * tokens_per_rank + j is source s's j-th row, j < recv_counts[s].
struct RankMajorReceive {
  int32_t tokens_per_rank;
  const void* hidden;            // [world * tpr, hidden_row_bytes]
  const void* scales;            // [world * tpr, scale_row_bytes], NULL without scales
  const int32_t* ids;            // [world * tpr, top_k]: local picks keep their global id
  const float* weights;          // [world * tpr, top_k], NULL: every row weight is 1.0
  const int32_t* recv_counts;    // [world]
  const int32_t* source_tokens;  // [world * tpr]: each row's token index on its source
};

// The layout's results and its private state (device memory, sized by
// expert_layout_scratch_bytes and the layout's shapes for max_tokens_per_rank).
struct ExpertRowsBuffers {
  void* hidden;      // [rows, hidden_row_bytes]
  void* scales;      // row-major [rows, scale_row_bytes] or columns; NULL without scales
  int32_t* counts;   // [E_local]: rows written per expert
  int32_t* offsets;  // [E_local + 1]: each expert's first row, then the aligned total
  int32_t* sources;  // [rows, 3]: source rank, source token, pick; -1 on padding rows
  float* weights;    // [rows]: the pick's weight; 0 on padding rows
  int32_t* dropped;  // [1]: pairs that did not fit
  // Private.
  int32_t* pick_ranks;   // [world * max_tpr, top_k]: a local pick's place among its tile's pairs of its expert
  int32_t* tile_counts;  // [expert_layout_tiles, E_local]: a warp tile's first place per expert inside its
                         // block tile, then a block tile's first place per expert
  int32_t* token_rows;   // [world * max_tpr, top_k]: a row's expert rows in combine's order, -1 after the last
  uint32_t* ticket;      // [1]: ranking blocks finished in this call (zero between calls)
};

// The ranking's tiles of `receive_rows` rank-major rows: warp tiles of
// kExpertTileRows rows, grouped into block tiles of kExpertTileWarps of them.
MOE_EP_HOST_DEVICE int64_t expert_layout_warp_tiles(int64_t receive_rows) {
  return (receive_rows + kExpertTileRows - 1) / kExpertTileRows;
}
MOE_EP_HOST_DEVICE int64_t expert_layout_block_tiles(int64_t receive_rows) {
  return (receive_rows + kExpertTileRows * kExpertTileWarps - 1) / (kExpertTileRows * kExpertTileWarps);
}
// Segments of a row of `row_bytes` (at least one).
MOE_EP_HOST_DEVICE int64_t expert_layout_segments(int64_t row_bytes) {
  return row_bytes <= kExpertSegmentBytes ? 1 : (row_bytes + kExpertSegmentBytes - 1) / kExpertSegmentBytes;
}
// Rows of ExpertRowsBuffers::tile_counts: one per warp tile, then one per block tile.
MOE_EP_HOST_DEVICE int64_t expert_layout_tiles(int64_t receive_rows) {
  return expert_layout_warp_tiles(receive_rows) + expert_layout_block_tiles(receive_rows);
}

// After a rank-major dispatch on the same stream: counts, offsets and
// dropped; the rows, scales, sources and weights of every kept pair; sources
// -1 and weight 0 on every other row (the payload of those rows is left as
// it was); token_rows for combine.  Two launches, the second with
// Programmatic Dependent Launch when `pdl` is nonzero; at most `max_blocks`
// blocks each.  Expects rank-major ids that are valid or not local (the
// dispatch already dropped bad ids).
cudaError_t launch_expand_to_expert_rows(const ExpertLayoutShape& shape, const RankMajorReceive& in,
                                         const ExpertRowsBuffers& rows, int32_t max_blocks, int32_t pdl,
                                         cudaStream_t stream);

// Before a rank-major combine of the same dispatch: for each received row
// i < recv_counts of its source, the fp32 sum from 0 of its expert rows of
// `expert_output` ([rows, combine_row_bytes]) in ascending (local expert,
// pick) order, each times its weight unless shape.weighted (products
// rounded before they are added), stored as combine_dtype into row i of
// `rank_major_out` ([world * tpr, combine_row_bytes]); other rows are left
// as they are.
cudaError_t launch_reduce_expert_rows(const ExpertLayoutShape& shape, const RankMajorReceive& in,
                                      const ExpertRowsBuffers& rows, const void* expert_output, void* rank_major_out,
                                      int32_t max_blocks, int32_t pdl, cudaStream_t stream);

}  // namespace kernels
}  // namespace moe_ep
