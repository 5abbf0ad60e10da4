// What both GPU backends need to run the expert layouts
// (cuda/expert_layout_kernels.h): the kernels' view of the layout, and the
// regions of the layout's results and private state, placed in a backend's
// own memory (the NVLink workspace, the NCCL backend's allocation).
#pragma once

#include <cstdint>

#include "common/region_planner.hpp"
#include "expert_layout_kernels.h"
#include "params.hpp"

namespace moe_ep {

// Byte offsets of ExpertRowsBuffers' regions from a base, for the layout's
// max_tokens_per_rank.  All zero-sized (and unused) for RANK_MAJOR.
struct ExpertRowsOffsets {
  uint64_t hidden = 0;
  uint64_t scales = 0;
  uint64_t counts = 0;
  uint64_t offsets = 0;
  uint64_t sources = 0;
  uint64_t weights = 0;
  uint64_t dropped = 0;
  uint64_t pick_ranks = 0;
  uint64_t tile_counts = 0;
  uint64_t token_rows = 0;
  uint64_t ticket = 0;
};

// The kernels' view of `layout` (an expert layout).
kernels::ExpertLayoutShape expert_layout_shape(const Layout& layout);

// Places the regions with `planner` (nothing for RANK_MAJOR).  Throws
// INVALID_ARGUMENT naming the region whose size overflows.
ExpertRowsOffsets place_expert_rows(const Layout& layout, RegionPlanner& planner);

// The buffers at `base` (device memory) for offsets placed by place_expert_rows.
kernels::ExpertRowsBuffers expert_rows_buffers(const Layout& layout, char* base, const ExpertRowsOffsets& offsets);

// Set-up: the ticket region must be zero before the first call (the kernels
// leave it zero after each); a backend clears it once at create.

}  // namespace moe_ep
