// Where the GPU backends place the zero-copy combine input region: pure host
// maths of their workspace plans, so it runs without a GPU.
#include <catch2/catch.hpp>

#include <cstdint>

#include "nccl/nccl_backend.hpp"
#include "nccl/nccl_workspace.hpp"
#include "nvlink/workspace_plan.hpp"
#include "params.hpp"
#include "test_params.hpp"

namespace {

moe_ep::Layout layout(bool zero_copy) {
  const moe_ep_params_t p = moe_ep_test::make_params(256, 8, 4096, 7168);
  moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), 2, 0);
  l.zero_copy_combine = zero_copy;
  return l;
}

constexpr uint64_t kRegion = 2ull * 4096 * 7168 * 2;       // world x max_tokens rows of bf16
constexpr uint64_t kLandingRows = 1ull * 4096 * 7168 * 2;  // (world - 1) x max_tokens rows of bf16

}  // namespace

TEST_CASE("zero-copy combine: the NVLink plan swaps the push landing rows for the view", "[zero_copy][nvlink]") {
  const moe_ep::kernels::WorkspaceOffsets off = moe_ep::plan_workspace(layout(false));
  const moe_ep::kernels::WorkspaceOffsets on = moe_ep::plan_workspace(layout(true));
  CHECK(moe_ep::combine_input_region_bytes(layout(false)) == 0);
  CHECK(moe_ep::combine_input_region_bytes(layout(true)) == kRegion);
  // Disabled: an empty view, so every later offset is where it was before the feature.
  CHECK(off.combine_input == off.peer_bases);
  CHECK(off.combine_input - off.combine_in == kLandingRows);
  // Enabled: every combine pulls, so the push landing rows (combine_in) are an
  // empty region and the view follows them, 256-byte aligned, before the private regions.
  CHECK(on.combine_in == off.combine_in);
  CHECK(on.combine_input == on.combine_in);
  CHECK(on.combine_input % 256 == 0);
  CHECK(on.peer_bases - on.combine_input == kRegion);  // kRegion is a multiple of 256
  CHECK(on.total_bytes - off.total_bytes == kRegion - kLandingRows);
  CHECK(on.recv_hidden == off.recv_hidden);
  // docs/semantics.md §6: 2 x world x max_tokens x row bytes + 64 MiB, with the view.
  CHECK(on.total_bytes <= 2 * kRegion + (64ull << 20));
  CHECK(off.total_bytes <= 2 * kRegion + (64ull << 20));
}

TEST_CASE("zero-copy combine: the NCCL plan adds a device region only when enabled", "[zero_copy][nccl]") {
  const moe_ep::NcclWorkspacePlan off = moe_ep::plan_nccl_workspace(layout(false));
  const moe_ep::NcclWorkspacePlan on = moe_ep::plan_nccl_workspace(layout(true));
  CHECK(off.combine_input == off.total_bytes);
  CHECK(on.combine_input == off.total_bytes);
  CHECK(on.total_bytes - off.total_bytes == kRegion);
  CHECK(moe_ep::nccl_workspace_bytes(layout(true)) - moe_ep::nccl_workspace_bytes(layout(false)) == kRegion);
}
