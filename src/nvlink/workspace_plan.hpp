// Where each region lives in one rank's workspace (the same on every rank, so
// that a peer's region is its base plus the same offset), and how big the
// whole is.  Sizes follow docs/semantics.md §6: one dispatch receive region and one combine
// region of world x max_tokens_per_rank rows (the push combine's landing rows,
// or the zero-copy combine_input view), no double buffering; with
// config.micro_batches = 2, two such slots.
#pragma once

#include <cstdint>

#include "gpu/expert_rows_plan.hpp"
#include "gpu/group_shape.hpp"
#include "moe_ep_kernels.h"
#include "params.hpp"

namespace moe_ep {

// Offsets of buffer slot 0 for this layout, placed by common/region_planner.hpp;
// total_bytes is the size of one slot before the allocation granularity (a
// multiple of the regions' alignment).  In an expert layout the expansion's
// regions (gpu/expert_rows_plan.hpp) are the slot's last, before total_bytes;
// their offsets go to *expert_rows when it is not NULL.  Throws
// INVALID_ARGUMENT on overflow.
kernels::WorkspaceOffsets plan_workspace(const Layout& layout, ExpertRowsOffsets* expert_rows = nullptr);

// Buffer slot `slot` (config.micro_batches, docs/overlap.md) is a whole copy
// of slot 0's layout right after the previous slot: its offsets, each moved
// by slot x total_bytes (total_bytes moves too: the slot's end).
kernels::WorkspaceOffsets slot_offsets(const kernels::WorkspaceOffsets& first, int32_t slot);

// Slot `slot`'s expansion regions: slot 0's (from plan_workspace) moved by
// whole slots of `slot_bytes` (slot 0's total_bytes), like slot_offsets.
ExpertRowsOffsets slot_expert_rows(const ExpertRowsOffsets& first, uint64_t slot_bytes, int32_t slot);

// The workspace of `slots` slots (fewer than 1 counts as 1).
uint64_t slots_total_bytes(const kernels::WorkspaceOffsets& first, int32_t slots);

}  // namespace moe_ep
