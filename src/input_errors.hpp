// Messages for bad data found in a call's inputs (reported later through
// moe_ep_get_async_error as INVALID_INPUT), worded the same whichever backend
// found them.
#pragma once

#include <cstdint>
#include <string>

#include "params.hpp"

namespace moe_ep {

// `count` picks of a dispatch on layout.rank were neither a valid expert nor
// the invalid id; the first (lowest token, then pick) was `id`.
std::string bad_ids_message(const Layout& layout, int64_t count, int64_t first_token, int32_t first_pick,
                            int32_t id);

}  // namespace moe_ep
