#include "gpu/expert_rows_plan.hpp"

#include "checked_math.hpp"
#include "dtype.hpp"
#include "gpu/wire_rows_plan.hpp"
#include "moe_ep_kernels.h"

namespace moe_ep {

namespace {

constexpr const char* kWhat = "expert layout regions";

uint64_t mul(uint64_t a, uint64_t b) { return checked_mul(a, b, kWhat); }

}  // namespace

kernels::ExpertLayoutShape expert_layout_shape(const Layout& l) {
  const Layout received = received_layout(l);  // the rows as dispatch leaves them (FP8 wire included)
  kernels::ExpertLayoutShape s{};
  s.world_size = l.world_size;
  s.top_k = l.top_k;
  s.experts_per_rank = l.experts_per_rank();
  s.first_expert = l.rank * l.experts_per_rank();
  s.max_tokens_per_rank = l.max_tokens_per_rank;
  s.packed = l.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED ? 1 : 0;
  s.capacity = l.expert_capacity;
  s.alignment = l.expert_alignment;
  s.rows = static_cast<int32_t>(l.expert_layout_rows());  // int32 by the params' checks
  s.scale_row_elems = received.scale_row_elems;
  s.scale_columns = l.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR && received.scale_row_elems > 0 ? 1 : 0;
  s.hidden_size = l.hidden_size;
  s.combine_dtype = kernel_dtype(l.combine_dtype);
  s.weighted = l.expert_output_weighted ? 1 : 0;
  s.hidden_row_bytes = static_cast<int64_t>(received.hidden_row_bytes);
  s.scale_row_bytes = static_cast<int64_t>(received.scale_row_bytes);
  s.combine_row_bytes = static_cast<int64_t>(l.combine_row_bytes);
  return s;
}

ExpertRowsOffsets place_expert_rows(const Layout& l, RegionPlanner& p) {
  ExpertRowsOffsets o;
  if (!l.expert_layout()) return o;
  const Layout received = received_layout(l);
  const uint64_t rows = static_cast<uint64_t>(l.expert_layout_rows());
  const uint64_t E = static_cast<uint64_t>(l.experts_per_rank());
  const uint64_t receive = static_cast<uint64_t>(l.receive_rows(l.max_tokens_per_rank));
  const uint64_t picks = mul(receive, static_cast<uint64_t>(l.top_k));
  const uint64_t tiles = static_cast<uint64_t>(kernels::expert_layout_tiles(static_cast<int64_t>(receive)));
  uint64_t scale_bytes = 0;
  if (received.scale_row_elems > 0) {
    scale_bytes = l.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR
                      ? mul(static_cast<uint64_t>(received.expert_scale_elems()), sizeof(float))
                      : mul(rows, received.scale_row_bytes);
  }
  o.hidden = p.place(mul(rows, received.hidden_row_bytes));
  o.scales = p.place(scale_bytes);
  o.counts = p.place(mul(E, sizeof(int32_t)));
  o.offsets = p.place(mul(E + 1, sizeof(int32_t)));
  o.sources = p.place(mul(mul(rows, 3), sizeof(int32_t)));
  o.weights = p.place(mul(rows, sizeof(float)));
  o.dropped = p.place(sizeof(int32_t));
  o.pick_ranks = p.place(mul(picks, sizeof(int32_t)));
  o.tile_counts = p.place(mul(mul(tiles, E), sizeof(int32_t)));
  o.token_rows = p.place(mul(picks, sizeof(int32_t)));
  o.ticket = p.place(sizeof(uint32_t));
  return o;
}

kernels::ExpertRowsBuffers expert_rows_buffers(const Layout& l, char* base, const ExpertRowsOffsets& o) {
  kernels::ExpertRowsBuffers b{};
  if (!l.expert_layout()) return b;
  b.hidden = base + o.hidden;
  b.scales = received_layout(l).scale_row_elems > 0 ? base + o.scales : nullptr;
  b.counts = reinterpret_cast<int32_t*>(base + o.counts);
  b.offsets = reinterpret_cast<int32_t*>(base + o.offsets);
  b.sources = reinterpret_cast<int32_t*>(base + o.sources);
  b.weights = reinterpret_cast<float*>(base + o.weights);
  b.dropped = reinterpret_cast<int32_t*>(base + o.dropped);
  b.pick_ranks = reinterpret_cast<int32_t*>(base + o.pick_ranks);
  b.tile_counts = reinterpret_cast<int32_t*>(base + o.tile_counts);
  b.token_rows = reinterpret_cast<int32_t*>(base + o.token_rows);
  b.ticket = reinterpret_cast<uint32_t*>(base + o.ticket);
  return b;
}

}  // namespace moe_ep
