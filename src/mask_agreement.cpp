#include "mask_agreement.hpp"

#include <cstring>

namespace moe_ep {

std::string mask_text(const std::vector<uint8_t>& mask) {
  std::string text = "{";
  for (size_t r = 0; r < mask.size(); ++r) text += (r ? "," : "") + std::to_string(int(mask[r]));
  return text + "}";
}

void agree_on_mask(const Exchange& exchange, const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                   const std::string& local_message, const char* step) {
  exchange.agree(local_status, local_message);
  const size_t world = active.size();
  std::vector<uint8_t> all(world * world);
  exchange.allgather(active.data(), all.data(), world, step);
  const std::vector<uint8_t> first(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(world));
  for (size_t s = 1; s < world; ++s) {
    if (std::memcmp(all.data() + s * world, first.data(), world) != 0) {
      const std::vector<uint8_t> theirs(all.begin() + static_cast<std::ptrdiff_t>(s * world),
                                        all.begin() + static_cast<std::ptrdiff_t>((s + 1) * world));
      fail(MOE_EP_ERROR_INVALID_ARGUMENT, "moe_ep_set_active_ranks: active: every rank must pass the same mask; rank ",
           s, " passed ", mask_text(theirs), ", rank 0 ", mask_text(first));
    }
  }
}

}  // namespace moe_ep
