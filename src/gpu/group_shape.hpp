// The kernels' view of a layout, shared by both GPU backends: the group's
// sizes and row bytes as every dispatch and combine kernel reads them.
#pragma once

#include <cstdint>

#include "moe_ep_kernels.h"
#include "params.hpp"

namespace moe_ep {

// Bytes of one combine partial as it crosses (GroupShape::combine_partial_bytes):
// a combine_dtype row, or with an FP8 combine wire a wire row.
int64_t combine_partial_bytes(const Layout& layout);

// The kernels' view of the layout: its row sizes are those of `layout` as
// given, so a backend with an FP8 dispatch wire passes wire_layout(layout)
// for the rows its dispatch moves (the combine fields do not depend on it).
kernels::GroupShape group_shape(const Layout& layout);

}  // namespace moe_ep
