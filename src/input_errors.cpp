#include "input_errors.hpp"

namespace moe_ep {

std::string bad_ids_message(const Layout& layout, int64_t count, int64_t first_token, int32_t first_pick,
                            int32_t id) {
  return "dispatch on rank " + std::to_string(layout.rank) + ": " + std::to_string(count) + " topk_ids outside [0, " +
         std::to_string(layout.num_experts) + ") and not invalid_expert_id (" +
         std::to_string(layout.invalid_expert_id) + "), first at token " + std::to_string(first_token) + " pick " +
         std::to_string(first_pick) + ": " + std::to_string(id) + "; those picks were dropped";
}

}  // namespace moe_ep
