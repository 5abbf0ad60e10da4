#include "nccl/nccl_workspace.hpp"

#include "checked_math.hpp"
#include "common/region_planner.hpp"
#include "error.hpp"
#include "gpu/group_shape.hpp"

namespace moe_ep {

namespace {

constexpr uint64_t kAlignment = 256;  // rows of 16-byte multiples stay aligned for vector loads

constexpr const char* kWhat = "params: the NCCL backend's buffers";

uint64_t plus(uint64_t a, uint64_t b) { return checked_add(a, b, kWhat); }
uint64_t times(uint64_t a, uint64_t b) { return checked_mul(a, b, kWhat); }
uint64_t round_up(uint64_t v, uint64_t to) { return align_up(v, to, kWhat); }

}  // namespace

NcclWorkspacePlan plan_nccl_workspace(const Layout& caller) {
  // Dispatch's buffers hold the rows as they cross (an FP8 wire's codes and
  // scales); the caller's layout sizes the wire's own buffers.
  const Layout l = wire_layout(caller);
  const kernels::NcclShape shape = nccl_shape(caller);
  const uint64_t W = static_cast<uint64_t>(l.world_size);
  const uint64_t M = static_cast<uint64_t>(l.max_tokens_per_rank);
  const uint64_t K = static_cast<uint64_t>(l.top_k);
  const uint64_t E = static_cast<uint64_t>(l.num_experts);
  const uint64_t rows = times(W, M);
  const uint64_t header = static_cast<uint64_t>(kernels::nccl_header_ints(shape)) * sizeof(int32_t);
  const uint64_t chunks = (M + kernels::kNcclRouteChunk - 1) / kernels::kNcclRouteChunk;
  // One segment's metadata (kernels::nccl_meta_bytes), checked here so that
  // the kernels' int64 arithmetic on it cannot overflow.
  const uint64_t meta_row =
      plus(plus(times(K, 2 * sizeof(int32_t)), l.scale_row_bytes), l.expert_layout() ? sizeof(int32_t) : 0);
  const uint64_t meta = times(M, meta_row) + header;
  RegionPlanner p(kWhat, kAlignment);
  NcclWorkspacePlan o{};
  o.meta_stride = round_up(meta, 16);
  o.meta_gap = round_up(meta, 256);
  // Receive rows with room for a metadata block before them (source 0's) and
  // after them (source world-1's): [gap][W x M rows, 16-byte rounded][gap].
  const uint64_t recv_rows = round_up(times(rows, l.hidden_row_bytes), 16);
  o.recv_hidden = plus(p.place(plus(plus(o.meta_gap, recv_rows), o.meta_gap)), o.meta_gap);
  // One send segment per destination: M rows and one block, either order.
  o.send_segment_stride = round_up(plus(round_up(times(M, l.hidden_row_bytes), 16), o.meta_gap), 256);
  o.recv_scales = p.place(times(rows, l.scale_row_bytes));
  o.recv_ids = p.place(times(times(rows, K), sizeof(int32_t)));
  o.recv_weights = p.place(times(times(rows, K), sizeof(float)));
  o.recv_meta = p.place(times(W, o.meta_stride));
  o.recv_counts = p.place(W * sizeof(int32_t));
  o.local_expert_counts = p.place(static_cast<uint64_t>(l.experts_per_rank()) * sizeof(int32_t));
  o.eplb_gathered = p.place(l.eplb_stats ? times(W * E, sizeof(int32_t)) : 0);
  // The send segments (dispatch: packed, then sent) and the combine input
  // (combine: received, then reduced) share one region: every access to either
  // is ordered on the handle's one stream (the side and NCCL streams join it
  // before a call returns), and they are live in different phases (dispatch
  // N's sends complete before combine N's receives start; combine N's
  // reduction completes before dispatch N+1 packs).  This is what keeps the
  // workspace within 2 x W x M x row bytes + 64 MiB (docs/nccl_backend.md,
  // "Workspace").
  const uint64_t combine_row = static_cast<uint64_t>(kernels::nccl_combine_transfer_row_bytes(shape));
  const uint64_t segments = times(W, o.send_segment_stride), combine_rows = times(rows, combine_row);
  o.send_segments = p.place(segments > combine_rows ? segments : combine_rows);
  o.combine_in = o.send_segments;
  o.local_slots = p.place(times(rows, sizeof(int32_t)));
  o.token_slots = p.place(times(rows, sizeof(int32_t)));
  o.chunk_offsets = p.place(times(times(chunks, W), sizeof(int32_t)));
  o.dest_rows = p.place(W * sizeof(int32_t));
  o.expert_hist = p.place(E * sizeof(int32_t));
  o.route_done = p.place(sizeof(uint32_t));
  o.errors = p.place(sizeof(kernels::NcclDeviceErrors));
  o.masked_ranks = p.place(sizeof(uint64_t));
  o.combine_out = p.place(times(M, l.combine_row_bytes));
  o.combine_input = p.place(combine_input_region_bytes(caller));
  const bool expert = l.expert_layout();
  o.recv_tokens = p.place(expert ? times(rows, sizeof(int32_t)) : 0);
  o.expert = place_expert_rows(caller, p);
  o.expert_combine_rows = p.place(expert ? times(rows, l.combine_row_bytes) : 0);
  const bool fp8_dispatch = caller.fp8_dispatch();
  o.wire_codes = p.place(fp8_dispatch ? times(M, static_cast<uint64_t>(caller.hidden_row_elems)) : 0);
  o.wire_scales = p.place(fp8_dispatch ? times(M, l.scale_row_bytes) : 0);
  o.dequantized = p.place(fp8_dispatch && caller.dispatch_dequantize ? times(rows, caller.hidden_row_bytes) : 0);
  o.combine_wire = p.place(caller.fp8_combine() ? combine_rows : 0);
  o.total_bytes = p.end();
  return o;
}

kernels::NcclShape nccl_shape(const Layout& l) {
  kernels::NcclShape s{};
  static_cast<kernels::GroupShape&>(s) = group_shape(wire_layout(l));
  s.source_tokens = l.expert_layout() ? 1 : 0;
  s.fp8_combine = l.fp8_combine() ? 1 : 0;
  return s;
}

uint64_t nccl_workspace_total(const NcclWorkspacePlan& plan, int32_t slots) {
  return slots_bytes(plan.total_bytes, slots, kWhat);
}

kernels::NcclBuffers nccl_buffers_at(char* base, const NcclWorkspacePlan& o, const Layout& caller) {
  const Layout l = wire_layout(caller);  // recv_scales: an FP8 dispatch wire's scales
  kernels::NcclBuffers b{};
  auto at = [base](uint64_t offset) { return base + offset; };
  b.recv_hidden = at(o.recv_hidden);
  b.recv_scales = l.scale_row_bytes ? at(o.recv_scales) : nullptr;
  b.recv_ids = reinterpret_cast<int32_t*>(at(o.recv_ids));
  b.recv_weights = reinterpret_cast<float*>(at(o.recv_weights));
  b.recv_tokens = l.expert_layout() ? reinterpret_cast<int32_t*>(at(o.recv_tokens)) : nullptr;
  b.recv_meta = at(o.recv_meta);
  b.recv_counts = reinterpret_cast<int32_t*>(at(o.recv_counts));
  b.local_expert_counts = reinterpret_cast<int32_t*>(at(o.local_expert_counts));
  b.eplb_gathered = l.eplb_stats ? reinterpret_cast<int32_t*>(at(o.eplb_gathered)) : nullptr;
  b.send_segments = at(o.send_segments);
  b.local_slots = reinterpret_cast<int32_t*>(at(o.local_slots));
  b.token_slots = reinterpret_cast<int32_t*>(at(o.token_slots));
  b.chunk_offsets = reinterpret_cast<int32_t*>(at(o.chunk_offsets));
  b.dest_rows = reinterpret_cast<int32_t*>(at(o.dest_rows));
  b.expert_hist = reinterpret_cast<int32_t*>(at(o.expert_hist));
  b.route_done = reinterpret_cast<uint32_t*>(at(o.route_done));
  b.errors = reinterpret_cast<kernels::NcclDeviceErrors*>(at(o.errors));
  b.masked_ranks = reinterpret_cast<const uint64_t*>(at(o.masked_ranks));
  b.combine_in = at(o.combine_in);
  b.combine_out = at(o.combine_out);
  return b;
}

kernels::ExpertRowsBuffers nccl_expert_rows_at(char* base, const NcclWorkspacePlan& o, const Layout& l) {
  return expert_rows_buffers(l, base, o.expert);
}

NcclWireBuffers nccl_wire_buffers_at(char* base, const NcclWorkspacePlan& o, const Layout& l) {
  NcclWireBuffers w{};
  if (l.fp8_dispatch()) {
    w.codes = reinterpret_cast<uint8_t*>(base + o.wire_codes);
    w.scales = reinterpret_cast<float*>(base + o.wire_scales);
    if (l.dispatch_dequantize) w.dequantized = base + o.dequantized;
  }
  if (l.fp8_combine()) w.combine_rows = base + o.combine_wire;
  return w;
}

}  // namespace moe_ep
