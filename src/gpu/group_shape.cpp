#include "gpu/group_shape.hpp"

#include "dtype.hpp"
#include "gpu/wire_rows_plan.hpp"

namespace moe_ep {

int64_t combine_partial_bytes(const Layout& l) {
  return l.fp8_combine() ? kernels::wire_transfer_row_bytes(l.hidden_size) : static_cast<int64_t>(l.combine_row_bytes);
}

kernels::GroupShape group_shape(const Layout& l) {
  kernels::GroupShape s{};
  s.rank = l.rank;
  s.world_size = l.world_size;
  s.num_experts = l.num_experts;
  s.experts_per_rank = l.experts_per_rank();
  s.top_k = l.top_k;
  s.invalid_expert_id = l.invalid_expert_id;
  kernels::division_magic(static_cast<uint32_t>(l.experts_per_rank()), &s.owner_magic, &s.owner_shift);
  s.max_tokens_per_rank = l.max_tokens_per_rank;
  s.hidden_size = l.hidden_size;
  s.combine_dtype = kernel_dtype(l.combine_dtype);
  s.eplb_enabled = l.eplb_stats ? 1 : 0;
  s.send_token_index = l.expert_layout() ? 1 : 0;
  s.hidden_row_bytes = static_cast<int64_t>(l.hidden_row_bytes);
  s.scale_row_bytes = static_cast<int64_t>(l.scale_row_bytes);
  s.combine_row_bytes = static_cast<int64_t>(l.combine_row_bytes);
  s.combine_wire = l.fp8_combine() ? 1 : 0;
  s.combine_partial_bytes = combine_partial_bytes(l);
  return s;
}

}  // namespace moe_ep
