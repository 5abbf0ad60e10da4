// Where each region lives in one rank's workspace (the same on every rank, so
// that a peer's region is its base plus the same offset), and how big the
// whole is.  Sizes follow docs/semantics.md §6: one dispatch receive region and one combine
// region of world x max_tokens_per_rank rows (the push combine's landing rows,
// or the zero-copy combine_input view), no double buffering.
#pragma once

#include <cstdint>

#include "moe_ep_kernels.h"
#include "params.hpp"

namespace moe_ep {

// Offsets for this layout; total_bytes is the unrounded size.
kernels::WorkspaceOffsets plan_workspace(const Layout& layout);

// The kernels' view of the layout.
kernels::GroupShape group_shape(const Layout& layout);

}  // namespace moe_ep
