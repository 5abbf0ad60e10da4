// Where the NVLink backend places the regions of the expert layouts and of
// the FP8 wires: pure host maths of its workspace plan, so it runs
// without a GPU.  RANK_MAJOR with AS_IS rows must keep every offset it had
// without them; each new region has the size docs/nvlink_backend.md gives.
#include <catch2/catch.hpp>

#include <cstdint>

#include "gpu/wire_rows_plan.hpp"
#include "nvlink/workspace_plan.hpp"
#include "params.hpp"
#include "test_params.hpp"

namespace {

constexpr uint64_t W = 2, M = 4096, H = 7168, K = 8, E_LOCAL = 128;
constexpr uint64_t kRow = H * 2;  // bf16

moe_ep_params_t deepseek() { return moe_ep_test::make_params(256, int32_t(K), int32_t(M), int32_t(H)); }

moe_ep::Layout layout_of(const moe_ep_params_t& p, bool zero_copy = false) {
  moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), int32_t(W), 1);
  l.zero_copy_combine = zero_copy;
  return l;
}

// Bytes of the region that starts at `a` and ends where `b` starts.
uint64_t span(uint64_t a, uint64_t b) { return b - a; }

}  // namespace

TEST_CASE("NVLink plan: RANK_MAJOR AS_IS has no expert-layout or wire region", "[nvlink][layouts][wire]") {
  const moe_ep_params_t p = deepseek();
  for (bool zero_copy : {false, true}) {
    moe_ep::ExpertRowsOffsets rows;
    rows.hidden = 1;  // overwritten
    const moe_ep::kernels::WorkspaceOffsets o = moe_ep::plan_workspace(layout_of(p, zero_copy), &rows);
    CHECK(o.recv_tokens == o.combine_arrivals);  // 0 bytes
    CHECK(o.expert_combine_input == o.combine_staging);
    CHECK(o.combine_staging == o.wire_codes);
    CHECK(o.wire_codes == o.wire_scales);
    CHECK(o.wire_scales == o.wire_rows);
    CHECK(o.wire_rows == o.combine_wire_rows);
    CHECK(o.combine_wire_rows == o.total_bytes);
    CHECK(rows.hidden == 0);  // no expansion regions
    CHECK(span(o.recv_hidden, o.recv_scales) == W * M * kRow);
  }
}

TEST_CASE("NVLink plan: EXPERT_PACKED regions at the DeepSeek shape", "[nvlink][layouts]") {
  moe_ep_params_t p = deepseek();
  const moe_ep::kernels::WorkspaceOffsets rank_major = moe_ep::plan_workspace(layout_of(p));
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  p.expert_alignment = 128;
  p.expert_rows = 40960;  // a server's bound: the average 32,768 pairs and room for imbalance
  const moe_ep::Layout l = layout_of(p);
  moe_ep::ExpertRowsOffsets rows;
  const moe_ep::kernels::WorkspaceOffsets o = moe_ep::plan_workspace(l, &rows);
  // The token index per received row crosses with the row's ids.
  CHECK(span(o.recv_tokens, o.combine_arrivals) == moe_ep::align_up(W * M * 4, 256, "test"));
  // The push combine's rank-major rows, written by the weighted reduction.
  CHECK(span(o.combine_staging, o.wire_codes) == W * M * kRow);
  CHECK(o.expert_combine_input == o.combine_staging);  // no zero-copy view
  // The expansion's regions come last: expert rows first.
  CHECK(rows.hidden >= o.wire_rows);
  CHECK(span(rows.hidden, rows.scales) == 40960 * kRow);
  CHECK(rows.counts - rows.scales == 0);  // no scales
  CHECK(span(rows.sources, rows.weights) == moe_ep::align_up(40960 * 12, 256, "test"));
  CHECK(span(rows.pick_ranks, rows.tile_counts) == moe_ep::align_up(W * M * K * 4, 256, "test"));
  CHECK(o.total_bytes > rows.ticket);
  // Every offset before the new regions is where RANK_MAJOR has it.
  CHECK(o.recv_hidden == rank_major.recv_hidden);
  CHECK(o.recv_ids == rank_major.recv_ids);
  CHECK(o.recv_weights == rank_major.recv_weights);
  // What the layout costs over RANK_MAJOR: the expert rows, the staging rows
  // and small bookkeeping (under 8 MiB here).
  const uint64_t extra = o.total_bytes - rank_major.total_bytes;
  CHECK(extra >= (40960 + W * M) * kRow);
  CHECK(extra <= (40960 + W * M) * kRow + (8ull << 20));
}

TEST_CASE("NVLink plan: expert-layout regions move with their slot", "[nvlink][layouts]") {
  moe_ep_params_t p = moe_ep_test::make_params(16, 4, 64, 128);
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_MAJOR;
  const moe_ep::Layout l = layout_of(p, true);
  moe_ep::ExpertRowsOffsets rows;
  const moe_ep::kernels::WorkspaceOffsets o = moe_ep::plan_workspace(l, &rows);
  CHECK(span(o.expert_combine_input, o.combine_staging) ==
        moe_ep::align_up(uint64_t(l.expert_layout_rows()) * l.combine_row_bytes, 256, "test"));
  CHECK(o.combine_staging == o.wire_codes);  // the zero-copy view replaces the staging rows
  const moe_ep::ExpertRowsOffsets second = moe_ep::slot_expert_rows(rows, o.total_bytes, 1);
  CHECK(second.hidden == rows.hidden + o.total_bytes);
  CHECK(second.ticket == rows.ticket + o.total_bytes);
  CHECK(moe_ep::slot_offsets(o, 1).total_bytes == 2 * o.total_bytes);
}

TEST_CASE("NVLink plan: the FP8 dispatch wire's rows", "[nvlink][wire]") {
  moe_ep_params_t p = deepseek();
  const moe_ep::kernels::WorkspaceOffsets as_is = moe_ep::plan_workspace(layout_of(p));
  p.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  const moe_ep::kernels::WorkspaceOffsets fp8 = moe_ep::plan_workspace(layout_of(p));
  const uint64_t scales = (H + 127) / 128 * 4;  // 56 fp32 scales per row
  // What lands: e4m3 codes and fp32 scales instead of bf16 rows.
  CHECK(span(fp8.recv_hidden, fp8.recv_scales) == W * M * H);
  CHECK(span(fp8.recv_scales, fp8.recv_ids) == W * M * scales);
  // The sender's quantized rows; no dequantized rows without dispatch_dequantize.
  CHECK(span(fp8.wire_codes, fp8.wire_scales) == M * H);
  CHECK(span(fp8.wire_scales, fp8.wire_rows) == M * scales);
  CHECK(fp8.wire_rows == fp8.total_bytes);
  CHECK(fp8.recv_hidden == as_is.recv_hidden);
  p.dispatch_dequantize = 1;
  const moe_ep::kernels::WorkspaceOffsets dq = moe_ep::plan_workspace(layout_of(p));
  CHECK(span(dq.wire_rows, dq.total_bytes) == W * M * kRow);
}

TEST_CASE("NVLink plan: the FP8 combine wire's rows", "[nvlink][wire]") {
  moe_ep_params_t p = deepseek();
  p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  constexpr uint64_t kWireRow = H + (H + 127) / 128 * 4;  // 7168 codes + 56 scales, both 16-byte multiples
  for (bool zero_copy : {false, true}) {
    INFO("zero_copy_combine " << zero_copy);
    const moe_ep::Layout l = layout_of(p, zero_copy);
    const moe_ep::kernels::WorkspaceOffsets o = moe_ep::plan_workspace(l);
    // The wire always pushes: landing rows of wire rows, even with the view.
    CHECK(span(o.combine_in, o.combine_input) == (W - 1) * M * kWireRow);
    CHECK(span(o.combine_input, o.peer_bases) == (zero_copy ? W * M * kRow : 0));
    // This rank's quantized rank-major rows, last.
    CHECK(span(o.combine_wire_rows, o.total_bytes) == W * M * kWireRow);
    const moe_ep::kernels::GroupShape s = moe_ep::group_shape(l);
    CHECK(s.combine_wire == 1);
    CHECK(s.combine_partial_bytes == int64_t(kWireRow));
    CHECK(s.combine_row_bytes == int64_t(kRow));
    // docs/semantics.md §6: 2 x world x max_tokens x row bytes + 64 MiB,
    // without the view; with it, the wire's rows come on top of the view
    // (docs/nvlink_backend.md, "The FP8 wires").
    if (!zero_copy) CHECK(o.total_bytes <= 2 * W * M * kRow + (64ull << 20));
  }
  // A row whose parts are not 16-byte multiples: each part rounded up.
  p.hidden_size = 1000;
  const moe_ep::kernels::GroupShape odd = moe_ep::group_shape(layout_of(p));
  CHECK(odd.combine_partial_bytes == 1008 + 32);  // 1000 codes -> 1008; 8 scales, 32 bytes
  p.combine_wire = MOE_EP_WIRE_AS_IS;
  const moe_ep::kernels::GroupShape as_is = moe_ep::group_shape(layout_of(p));
  CHECK(as_is.combine_wire == 0);
  CHECK(as_is.combine_partial_bytes == as_is.combine_row_bytes);
}

TEST_CASE("GPU wire plan: the combine rows' quantize descriptor both backends launch", "[nvlink][nccl][wire]") {
  moe_ep_params_t p = deepseek();
  p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  p.wire_scale = MOE_EP_WIRE_SCALE_UE8M0;
  const moe_ep::Layout l = layout_of(p);
  alignas(16) static char in[16], wire[16];
  const moe_ep::kernels::WireQuantizeRows q = moe_ep::combine_quantize_rows(l, in, wire);
  constexpr int64_t kWireRow = int64_t(H) + (int64_t(H) + 127) / 128 * 4;
  CHECK(q.elems == int32_t(H));
  CHECK(q.dtype == moe_ep::kernels::kCombineBf16);
  CHECK(q.scale_rule == moe_ep::kernels::kWireScaleUe8m0);
  CHECK(q.in == static_cast<const void*>(in));
  CHECK(q.in_stride == int64_t(kRow));
  CHECK(q.codes == reinterpret_cast<uint8_t*>(wire));
  CHECK(q.codes_stride == kWireRow);
  CHECK(reinterpret_cast<const char*>(q.scales) == wire + H);  // after the 7168 codes, a 16-byte multiple
  CHECK(q.scales_stride == kWireRow);
  // The NVLink kernels' partial rows and the NCCL backend's wire rows are these rows.
  CHECK(moe_ep::group_shape(l).combine_partial_bytes == kWireRow);
}
