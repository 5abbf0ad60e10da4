#include "nvlink/workspace_plan.hpp"

#include <cstring>

#include "common/region_planner.hpp"
#include "dtype.hpp"
#include "gpu/wire_rows_plan.hpp"

namespace moe_ep {

namespace {

// Regions start on 256-byte boundaries: rows of 16-byte multiples stay aligned
// for vector loads, and no two regions share a cache line.
constexpr uint64_t kRegionAlignment = 256;

constexpr const char* kWhat = "params: the NVLink workspace";

}  // namespace

kernels::WorkspaceOffsets plan_workspace(const Layout& l, ExpertRowsOffsets* expert_rows) {
  const uint64_t W = static_cast<uint64_t>(l.world_size);
  const uint64_t M = static_cast<uint64_t>(l.max_tokens_per_rank);
  const uint64_t K = static_cast<uint64_t>(l.top_k);
  const uint64_t E = static_cast<uint64_t>(l.num_experts);
  const uint64_t epr = static_cast<uint64_t>(l.experts_per_rank());
  RegionPlanner p(kWhat, kRegionAlignment);
  kernels::WorkspaceOffsets o{};
  // Shared: written by peers.
  o.dispatch_arrivals = p.place(W * sizeof(uint64_t));
  o.dispatch_counts_in = p.place(W * sizeof(uint64_t));
  o.expert_counts_in = p.place(W * epr * sizeof(int32_t));
  o.eplb_gathered = p.place(l.eplb_stats ? W * E * sizeof(int32_t) : 0);
  // The rows as they cross: with an FP8 dispatch wire its codes and scales.
  const Layout wire = wire_layout(l);
  o.recv_hidden = p.place(W * M * wire.hidden_row_bytes);
  o.recv_scales = p.place(W * M * wire.scale_row_bytes);
  o.recv_ids = p.place(W * M * K * sizeof(int32_t));
  o.recv_weights = p.place(W * M * K * sizeof(float));
  o.recv_tokens = p.place(l.expert_layout() ? W * M * sizeof(int32_t) : 0);
  o.combine_arrivals = p.place(W * sizeof(uint64_t));
  o.combine_started = p.place(W * sizeof(uint64_t));
  o.dispatch_ready = p.place(sizeof(uint32_t));
  o.combine_ready = p.place(sizeof(uint32_t));
  o.combine_chunk_flags = p.place(W * M * sizeof(uint64_t));
  // The push combine's landing rows.  With zero_copy_combine every combine of
  // the group pulls from the peers' views and nothing lands here, so the
  // region is empty: the view replaces it, and the workspace stays within
  // docs/semantics.md §6's bound at the DeepSeek shape.
  // An FP8 combine wire always pushes (its rows are quantized first), so it
  // has landing rows, of wire rows, with or without the view.
  const uint64_t partial_bytes = static_cast<uint64_t>(combine_partial_bytes(l));
  o.combine_in = p.place(l.zero_copy_combine && !l.fp8_combine() ? 0 : (W - 1) * M * partial_bytes);
  // Last of the shared regions and 0 bytes unless enabled: without
  // zero_copy_combine every offset and the total are what they were before it.
  // Rank-major in every layout: the peers pull their rows from it (in an
  // expert layout the reduction of the expert rows writes it).
  o.combine_input = p.place(l.zero_copy_combine ? W * M * l.combine_row_bytes : 0);
  // Private.
  o.peer_bases = p.place(W * sizeof(uint64_t));
  o.control = p.place(sizeof(kernels::ControlBlock));
  o.expert_hist = p.place(E * sizeof(int32_t));  // used only beyond the kernels' shared histogram
  o.recv_counts = p.place(W * sizeof(int32_t));
  o.counts_private = p.place(W * sizeof(int32_t));
  o.local_expert_counts = p.place(epr * sizeof(int32_t));
  o.token_slots = p.place(M * W * sizeof(int32_t));
  o.dispatch_lookback = p.place(static_cast<uint64_t>(kernels::kMaxDispatchBlocks) * W * sizeof(uint64_t));
  o.combine_out = p.place(M * l.combine_row_bytes);
  // Expert layouts: the caller's expert output in the layout's shape (the
  // dispatch result's combine_input), or the push combine's rank-major rows.
  const bool expert = l.expert_layout();
  o.expert_combine_input = p.place(expert && l.zero_copy_combine ? combine_input_region_bytes(l) : 0);
  o.combine_staging = p.place(expert && !l.zero_copy_combine ? W * M * l.combine_row_bytes : 0);
  // The FP8 dispatch wire's private rows, 0 bytes without it (so every offset
  // and the total of an AS_IS layout are what they were before the wire).
  const bool fp8 = l.fp8_dispatch();
  o.wire_codes = p.place(fp8 ? M * wire.hidden_row_bytes : 0);
  o.wire_scales = p.place(fp8 ? M * wire.scale_row_bytes : 0);
  o.wire_rows = p.place(fp8 && l.dispatch_dequantize ? W * M * l.hidden_row_bytes : 0);
  // The FP8 combine wire's quantized rank-major rows, 0 bytes without it.
  o.combine_wire_rows = p.place(l.fp8_combine() ? W * M * partial_bytes : 0);
  const ExpertRowsOffsets rows = place_expert_rows(l, p);
  if (expert_rows != nullptr) *expert_rows = rows;
  o.total_bytes = p.end();
  return o;
}

ExpertRowsOffsets slot_expert_rows(const ExpertRowsOffsets& first, uint64_t slot_bytes, int32_t slot) {
  static_assert(sizeof(ExpertRowsOffsets) % sizeof(uint64_t) == 0, "only uint64_t fields");
  constexpr size_t kFields = sizeof(ExpertRowsOffsets) / sizeof(uint64_t);
  uint64_t fields[kFields];
  std::memcpy(fields, &first, sizeof first);
  const uint64_t shift = slot_start(slot_bytes, slot, kWhat);
  for (uint64_t& f : fields) f += shift;
  ExpertRowsOffsets out;
  std::memcpy(&out, fields, sizeof out);
  return out;
}

kernels::WorkspaceOffsets slot_offsets(const kernels::WorkspaceOffsets& first, int32_t slot) {
  // Every field is an offset (or the end), so the slot's copy is the same
  // layout moved by whole slots: each field moves alike.
  static_assert(sizeof(kernels::WorkspaceOffsets) % sizeof(uint64_t) == 0, "only uint64_t fields");
  constexpr size_t kFields = sizeof(kernels::WorkspaceOffsets) / sizeof(uint64_t);
  uint64_t fields[kFields];
  std::memcpy(fields, &first, sizeof first);
  const uint64_t shift = slot_start(first.total_bytes, slot, kWhat);
  for (uint64_t& f : fields) f += shift;
  kernels::WorkspaceOffsets out;
  std::memcpy(&out, fields, sizeof out);
  return out;
}

uint64_t slots_total_bytes(const kernels::WorkspaceOffsets& first, int32_t slots) {
  return slots_bytes(first.total_bytes, slots < 1 ? 1 : slots, kWhat);
}

}  // namespace moe_ep
