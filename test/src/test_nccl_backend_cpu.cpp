// The NCCL backend where it cannot run: NCCL missing or bogus is UNSUPPORTED
// with a message that names the path and says how to install NCCL; AUTO on a
// machine without GPUs stays on HOST; the buffer plan checks its sizes.  The
// GPU behaviour is tested in test/cuda/test_nccl_gpu.cpp.
#include <catch2/catch.hpp>

#include <algorithm>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backend_table.hpp"
#include "case_skip.hpp"
#include "error.hpp"
#include "handle.hpp"
#include "moe_ep_c.h"
#include "nccl/nccl_backend.hpp"
#include "nccl/nccl_library.hpp"
#include "nccl/nccl_workspace.hpp"
#include "nccl/nccl_workspace_memory.hpp"
#include "nccl_kernels.h"
#include "nvlink/nvlink_backend.hpp"
#include "nvlink/workspace_plan.hpp"
#include "rank_checks.hpp"
#include "scoped_environment.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

namespace {

// MOE_EP_NCCL_LIBRARY for the lifetime of the object.
class NcclLibraryOverride {
 public:
  explicit NcclLibraryOverride(const std::string& path) : variable_("MOE_EP_NCCL_LIBRARY", path.c_str()) {}

 private:
  moe_ep_test::ScopedEnvironment variable_;
};

moe_ep_config_t nccl_config() {
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  c.backend = MOE_EP_BACKEND_NCCL;
  c.timeout_ms = 5000;
  return c;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("NCCL missing: loading fails with the path and how to install it", "[nccl]") {
  const NcclLibraryOverride missing("/nonexistent/moe_ep_test/libnccl.so.2");
  std::string why;
  CHECK(moe_ep::nccl::load(&why) == nullptr);
  CHECK(contains(why, "/nonexistent/moe_ep_test/libnccl.so.2"));
  CHECK(contains(why, "pip install nvidia-nccl-cu13"));
  CHECK(contains(why, "MOE_EP_NCCL_LIBRARY"));
  CHECK(moe_ep::nccl::library_name() == "/nonexistent/moe_ep_test/libnccl.so.2");
}

TEST_CASE("NCCL requested where it cannot load: create is UNSUPPORTED on every rank, naming the path", "[nccl]") {
  char path[] = "/tmp/moe_ep_bogus_ncclXXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "not a shared object\n", 20) == 20);
  close(fd);
  const NcclLibraryOverride bogus(path);
  const moe_ep_params_t p = moe_ep_test::make_params(4, 2, 8, 16);
  const moe_ep_config_t c = nccl_config();
  moe_ep_test::RankChecks checks;
  moe_ep_test::run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = reinterpret_cast<moe_ep_handle_t>(0x1);
    const moe_ep_status_t s = moe_ep_create(&b, &p, &c, &h);
    const std::string message = moe_ep_last_error();
    RANK_CHECK(checks, rank, s == MOE_EP_ERROR_UNSUPPORTED);
    RANK_CHECK(checks, rank, h == nullptr);
    RANK_CHECK(checks, rank, contains(message, path));
    RANK_CHECK(checks, rank, contains(message, "MOE_EP_NCCL_LIBRARY"));
  });
  checks.assert_all();
  uint64_t bytes = 1;
  CHECK(moe_ep_workspace_size(&p, &c, 2, &bytes) == MOE_EP_ERROR_UNSUPPORTED);
  CHECK(contains(moe_ep_last_error(), path));
  std::remove(path);
}

TEST_CASE("config->backend accepts NCCL (3) and still refuses unknown values", "[nccl]") {
  moe_ep_config_t c = nccl_config();
  const moe_ep_config_t read = moe_ep::read_config(&c);
  CHECK(read.backend == MOE_EP_BACKEND_NCCL);
  c.backend = 4;
  CHECK_THROWS_AS(moe_ep::read_config(&c), moe_ep::Error);
}

TEST_CASE("AUTO agrees on one backend; without GPUs it is HOST and runs on CPU tensors", "[nccl][no_gpu]") {
  const moe_ep_params_t p = moe_ep_test::make_params(4, 2, 8, 16);
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  const bool nvlink = moe_ep::nvlink_platform_supported(-1);
  const bool nccl = moe_ep::nccl_platform_supported(-1, nullptr);
  // Two threads of one process share a host: the NVLink backend wins where it runs.
  const int32_t expected = nvlink ? MOE_EP_BACKEND_NVLINK_TWO_SIDED : nccl ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_HOST;
  if (expected != MOE_EP_BACKEND_HOST) {
    moe_ep_test::skip_case("a GPU machine: the GPU suites cover it");
    return;
  }
  moe_ep_test::RankChecks checks;
  moe_ep_test::run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = nullptr;
    RANK_REQUIRE(checks, rank, moe_ep_create(&b, &p, &c, &h) == MOE_EP_SUCCESS);
    RANK_CHECK(checks, rank, h->config.backend == MOE_EP_BACKEND_HOST);
    // One token per rank, going to expert 0 (rank 0) and 3 (rank 1), on CPU tensors.
    uint16_t hidden[16] = {};
    int32_t ids[2] = {0, 3};
    int64_t hidden_shape[2] = {1, 16}, ids_shape[2] = {1, 2};
    moe_ep_tensor_t th{hidden, {MOE_EP_DEVICE_CPU, 0}, 2, {MOE_EP_DTYPE_BFLOAT, 16, 1}, hidden_shape, nullptr, 0};
    moe_ep_tensor_t ti{ids, {MOE_EP_DEVICE_CPU, 0}, 2, {MOE_EP_DTYPE_INT, 32, 1}, ids_shape, nullptr, 0};
    moe_ep_dispatch_args_t args;
    moe_ep_dispatch_args_init(&args, sizeof args);
    args.hidden_states = &th;
    args.topk_ids = &ti;
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    RANK_REQUIRE(checks, rank, moe_ep_dispatch(h, &args, &r, nullptr) == MOE_EP_SUCCESS);
    const int32_t* counts = static_cast<const int32_t*>(r.recv_counts.data);
    RANK_CHECK(checks, rank, counts[0] == 1);
    RANK_CHECK(checks, rank, counts[1] == 1);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    std::vector<uint16_t> expert_output(2 * 8 * 16, 0);
    int64_t eo_shape[2] = {16, 16};
    moe_ep_tensor_t teo{expert_output.data(), {MOE_EP_DEVICE_CPU, 0}, 2, {MOE_EP_DTYPE_BFLOAT, 16, 1}, eo_shape,
                        nullptr, 0};
    RANK_REQUIRE(checks, rank, moe_ep_combine(h, &teo, nullptr, &cr, nullptr) == MOE_EP_SUCCESS);
    RANK_REQUIRE(checks, rank, moe_ep_destroy(&h) == MOE_EP_SUCCESS);
  });
  checks.assert_all();
}

TEST_CASE("NCCL buffer plan: the shared send / combine-input region holds the larger of the two rows", "[nccl]") {
  // An fp8 payload (7168 bytes a row) with a bf16 combine (14336), and an fp32 payload (28672) with it.
  for (const bool combine_wider : {true, false}) {
    moe_ep_params_t params = moe_ep_test::make_params(64, 4, 1024, 7168);
    if (combine_wider) {
      params.hidden_dtype = {MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
    } else {
      params.hidden_dtype = {MOE_EP_DTYPE_FLOAT, 32, 1};
    }
    const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&params), 4, 1);
    const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(l);
    INFO("hidden row " << l.hidden_row_bytes << " B, combine row " << l.combine_row_bytes << " B");
    const uint64_t rows = 4 * 1024;
    const uint64_t widest = std::max(l.hidden_row_bytes, l.combine_row_bytes);
    CHECK(l.hidden_row_bytes != l.combine_row_bytes);
    CHECK(plan.combine_in == plan.send_segments);
    CHECK(plan.local_slots - plan.send_segments >= rows * widest);  // the next region starts after both fit
    CHECK(plan.local_slots - plan.send_segments >= 4 * plan.send_segment_stride);
    CHECK(plan.send_segments - plan.recv_hidden >= rows * l.hidden_row_bytes);
  }
}

// The merged [block | rows] and [rows | block] operations of a dispatch are
// one NCCL send on one side and one receive on the other: the block must sit
// at the same distance from the segment's rows on both sides, inside the
// allocation, clear of every result row, and 4-byte aligned for its fields.
// The expert layouts' blocks are longer (each row's source token index).
TEST_CASE("NCCL metadata placement: sender and receiver agree, blocks stay clear of the rows", "[nccl]") {
  for (const int32_t receive_layout : {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    for (const int32_t hidden : {7168, 7}) {  // rows of 14336 bytes (joined) and 14 bytes (separate)
      for (const int32_t world : {2, 4, 8}) {
        moe_ep_params_t params = moe_ep_test::make_params(256, 8, 512, hidden);
        params.receive_layout = receive_layout;
        for (const int32_t tpr : {512, 100, 1}) {
          for (int32_t src = 0; src < world; ++src) {
            for (int32_t dst = 0; dst < world; ++dst) {
              if (src == dst) continue;
              const moe_ep::Layout ls = moe_ep::make_layout(moe_ep::read_params(&params), world, src);
              const moe_ep::Layout lr = moe_ep::make_layout(moe_ep::read_params(&params), world, dst);
              const moe_ep::kernels::NcclShape sender = moe_ep::nccl_shape(ls);
              const moe_ep::kernels::NcclShape receiver = moe_ep::nccl_shape(lr);
              const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(lr);
              const int64_t row = static_cast<int64_t>(lr.hidden_row_bytes);
              const int64_t meta = moe_ep::kernels::nccl_meta_bytes(receiver, tpr);
              // Sender: block and rows inside its segment, not overlapping.
              const int64_t s_rows = moe_ep::kernels::nccl_send_rows_offset(sender);
              const int64_t s_meta = moe_ep::kernels::nccl_send_meta_offset(sender, tpr);
              CHECK(s_meta % 16 == 0);
              if (src != world - 1) CHECK(s_meta % 256 == 0);  // [block | rows] leaves the sender 256-byte aligned
              CHECK((s_meta + meta <= s_rows || s_meta >= s_rows + tpr * row));
              CHECK(s_rows + tpr * row <= moe_ep::kernels::nccl_send_segment_stride(sender));
              CHECK(s_meta + meta <= moe_ep::kernels::nccl_send_segment_stride(sender));
              // Receiver: the block of src, relative to recv_hidden.
              const int64_t r_rows = static_cast<int64_t>(src) * tpr * row;
              const int64_t r_meta = moe_ep::kernels::nccl_recv_meta_offset(receiver, src, tpr);
              const bool edge = src == 0 || src == world - 1;
              CHECK((r_meta != -1) == edge);
              if (edge) {
                CHECK(r_meta % 16 == 0);
                if (src == 0) CHECK(r_meta % 256 == 0);  // the [block | rows] operation starts 256-byte aligned
                CHECK((r_meta + meta <= 0 || r_meta >= static_cast<int64_t>(world) * tpr * row));  // clear of all rows
                CHECK(r_meta >= -static_cast<int64_t>(plan.meta_gap));
                CHECK(r_meta + meta <= static_cast<int64_t>(plan.recv_scales - plan.recv_hidden));
              }
              const bool joined = moe_ep::kernels::nccl_meta_joins_rows(receiver, src);
              CHECK(joined == moe_ep::kernels::nccl_meta_joins_rows(sender, src));
              CHECK(joined == (edge && row % 16 == 0));
              if (joined) CHECK(r_meta - r_rows == s_meta - s_rows);  // one contiguous operation on both sides
            }
          }
        }
      }
    }
  }
}

TEST_CASE("NCCL buffer plan: aligned regions that hold every segment; overflow is INVALID_ARGUMENT", "[nccl]") {
  moe_ep_params_t params = moe_ep_test::make_params(256, 8, 4096, 7168);
  params.enable_eplb_stats = 1;
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&params), 2, 0);
  const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(l);
  const uint64_t rows = 2 * 4096;
  // Receive rows with room for one metadata block before and after them.
  CHECK(plan.recv_hidden >= plan.meta_gap);
  CHECK(plan.recv_scales - plan.recv_hidden >= rows * 7168 * 2 + plan.meta_gap);
  CHECK(plan.combine_out - plan.combine_in >= rows * 7168 * 2);
  CHECK(plan.total_bytes - plan.combine_out >= 4096ull * 7168 * 2);
  CHECK(plan.recv_hidden % 256 == 0);
  CHECK(plan.send_segments % 256 == 0);
  CHECK(plan.combine_in % 256 == 0);
  CHECK(plan.total_bytes == moe_ep::nccl_workspace_bytes(l));
  // One metadata block per rank, as the kernels index it: header, then ids and
  // weights of every row (no scales here), on both sides.
  const moe_ep::kernels::NcclShape shape = moe_ep::nccl_shape(l);
  CHECK(plan.meta_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_meta_stride(shape)));
  CHECK(plan.meta_stride % 16 == 0);
  CHECK(plan.meta_stride >= 4ull * moe_ep::kernels::nccl_header_ints(shape) + 4096ull * 8 * 8);
  CHECK(moe_ep::kernels::nccl_meta_bytes(shape, 4096) <= static_cast<int64_t>(plan.meta_stride));
  CHECK(plan.recv_counts - plan.recv_meta >= 2 * plan.meta_stride);
  // One send segment per destination: max_tokens rows and one block, either order.
  CHECK(plan.meta_gap == static_cast<uint64_t>(moe_ep::kernels::nccl_meta_gap(shape)));
  CHECK(plan.meta_gap % 256 == 0);
  CHECK(plan.meta_gap >= plan.meta_stride);
  CHECK(plan.send_segment_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_send_segment_stride(shape)));
  CHECK(plan.send_segment_stride % 256 == 0);
  CHECK(plan.send_segment_stride >= 4096ull * 7168 * 2 + plan.meta_gap);
  CHECK(plan.local_slots - plan.send_segments >= 2 * plan.send_segment_stride);
  // Two row buffers of world x max_tokens rows (receive; the send segments and
  // the combine input share one), within the documented workspace bound.
  CHECK(plan.combine_in == plan.send_segments);
  CHECK(plan.total_bytes <= 2 * rows * 7168 * 2 + 64ull * 1024 * 1024);

  moe_ep::Layout huge = l;
  huge.max_tokens_per_rank = 1 << 30;
  huge.hidden_row_bytes = uint64_t{1} << 40;
  CHECK_THROWS_AS(moe_ep::plan_nccl_workspace(huge), moe_ep::Error);
}

// Two micro-batches in flight: each buffer slot is one copy of the plan, so a
// slot's regions (results, send segments, combine rows, routing scratch,
// error record) never overlap another slot's, and every slot starts as
// aligned as slot 0 (the kernels' vector loads).
TEST_CASE("NCCL buffer slots: one plan per slot, disjoint, aligned, counted; overflow is INVALID_ARGUMENT", "[nccl]") {
  moe_ep_params_t params = moe_ep_test::make_params(256, 8, 4096, 7168);
  params.enable_eplb_stats = 1;
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&params), 2, 0);
  const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(l);
  CHECK(plan.total_bytes % 256 == 0);
  CHECK(moe_ep::nccl_workspace_total(plan, 1) == plan.total_bytes);
  CHECK(moe_ep::nccl_workspace_total(plan, 2) == 2 * plan.total_bytes);
  CHECK(moe_ep::nccl_workspace_bytes(l) == plan.total_bytes);  // one slot by default
  CHECK(moe_ep::nccl_workspace_bytes(l, 2) == 2 * plan.total_bytes);
  CHECK_THROWS_AS(moe_ep::nccl_workspace_total(plan, 0), moe_ep::Error);

  // Slot k is the plan at k x total_bytes: the plan's regions start at 0 and
  // end within total_bytes, so no slot reaches into the next one.
  CHECK(plan.recv_hidden >= plan.meta_gap);  // the gap before the receive rows is the slot's own
  CHECK(plan.recv_hidden - plan.meta_gap == 0);
  const uint64_t rows = 2 * 4096;
  const uint64_t widest = std::max<uint64_t>(rows * l.combine_row_bytes, 2 * plan.send_segment_stride);
  CHECK(plan.recv_scales - plan.recv_hidden >= rows * l.hidden_row_bytes + plan.meta_gap);
  CHECK(plan.local_slots - plan.send_segments >= widest);
  CHECK(plan.errors + sizeof(moe_ep::kernels::NcclDeviceErrors) <= plan.combine_out);
  CHECK(plan.combine_out + 4096ull * l.combine_row_bytes <= plan.total_bytes);
  CHECK(plan.combine_input + moe_ep::combine_input_region_bytes(l) <= plan.total_bytes);
  for (const uint64_t offset : {plan.recv_hidden, plan.send_segments, plan.combine_in, plan.combine_out}) {
    CHECK((plan.total_bytes + offset) % 256 == 0);  // slot 1's regions as aligned as slot 0's
  }

  moe_ep::NcclWorkspacePlan huge = plan;
  huge.total_bytes = uint64_t{1} << 63;
  CHECK_THROWS_AS(moe_ep::nccl_workspace_total(huge, 2), moe_ep::Error);
}

// Combine's split halves stage this rank's own rows at the same rows of the
// slot's combine_in (rank x tpr ..): NCCL never receives there (no transfer
// to itself), and the region holds them for any tokens_per_rank.
TEST_CASE("NCCL combine_in: the own segment is free for the staged rows and inside the region", "[nccl]") {
  for (const int32_t world : {2, 3, 8}) {
    moe_ep_params_t params = moe_ep_test::make_params(48, 4, 512, 7168);
    for (int32_t rank = 0; rank < world; ++rank) {
      const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&params), world, rank);
      const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(l);
      for (const int64_t tpr : {int64_t{512}, int64_t{100}, int64_t{1}}) {
        const uint64_t segment = static_cast<uint64_t>(tpr) * l.combine_row_bytes;
        CHECK(plan.combine_in + static_cast<uint64_t>(world) * segment <= plan.local_slots);
        // Every peer p's rows land at p x tpr: never in the own segment.
        for (int32_t p = 0; p < world; ++p) {
          if (p == rank) continue;
          const uint64_t begin = static_cast<uint64_t>(p) * segment, end = begin + segment;
          const uint64_t own = static_cast<uint64_t>(rank) * segment;
          CHECK((end <= own || begin >= own + segment));
        }
      }
    }
  }
}

TEST_CASE("NCCL micro_batches: moe_ep_workspace_size counts every slot (2 allowed, 3 refused)", "[nccl]") {
  // Without NCCL and a GPU the backend is not usable here: what is checked is
  // the backend table's limit and sizing, through the plan the table uses.
  moe_ep_params_t params = moe_ep_test::make_params(64, 4, 256, 1024);
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&params), 2, 0);
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).max_micro_batches == 2);
  moe_ep_config_t c = moe_ep::read_config(nullptr);
  c.micro_batches = 2;
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).workspace_bytes(l, c) == 2 * moe_ep::nccl_workspace_bytes(l));
  c.micro_batches = 1;
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).workspace_bytes(l, c) == moe_ep::nccl_workspace_bytes(l));
}

namespace {

// Stand-ins for NCCL's registration calls: only their presence is read.
moe_ep::nccl::Result fake_mem_alloc(void**, size_t) { return moe_ep::nccl::kSuccess; }
moe_ep::nccl::Result fake_mem_free(void*) { return moe_ep::nccl::kSuccess; }
moe_ep::nccl::Result fake_register(moe_ep::nccl::CommHandle, void*, size_t, void**) { return moe_ep::nccl::kSuccess; }
moe_ep::nccl::Result fake_deregister(moe_ep::nccl::CommHandle, void*) { return moe_ep::nccl::kSuccess; }

}  // namespace

TEST_CASE("NCCL registration: wanted only with the zero-copy view, the NCCL calls, and not switched off", "[nccl]") {
  moe_ep::nccl::Api api{};
  const moe_ep_test::ScopedEnvironment unset("MOE_EP_NCCL_REGISTER", nullptr);
  CHECK_FALSE(api.can_register());
  CHECK_FALSE(moe_ep::nccl_registration_wanted(api, true));  // an NCCL older than 2.19
  api.MemAlloc = fake_mem_alloc;
  api.MemFree = fake_mem_free;
  api.CommRegister = fake_register;
  CHECK_FALSE(api.can_register());  // every one of the four is needed
  api.CommDeregister = fake_deregister;
  REQUIRE(api.can_register());
  CHECK(moe_ep::nccl_registration_wanted(api, true));
  // Without the view combine would send from the caller's buffer, which NCCL
  // would see unregistered against this rank's registered receive buffer.
  CHECK_FALSE(moe_ep::nccl_registration_wanted(api, false));
  setenv("MOE_EP_NCCL_REGISTER", "0", 1);
  CHECK_FALSE(moe_ep::nccl_registration_wanted(api, true));
  setenv("MOE_EP_NCCL_REGISTER", "1", 1);
  CHECK(moe_ep::nccl_registration_wanted(api, true));
}

namespace {

moe_ep::Layout expert_layout_of(int32_t receive_layout, int32_t scale_layout, int32_t world, int32_t rank) {
  moe_ep_params_t params = moe_ep_test::make_params(64, 8, 512, 7168);
  params.hidden_dtype = {MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
  params.scale_row_elems = 56;  // fp32 scales, one per 128 elements
  params.receive_layout = receive_layout;
  params.scale_layout = scale_layout;
  if (receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) params.expert_alignment = 128;
  return moe_ep::make_layout(moe_ep::read_params(&params), world, rank);
}

}  // namespace

// The metadata block of an expert layout: [header][ids][weights][tokens][scales],
// the tokens (tpr int32, one per row) before the scales; a rank-major block has none.
TEST_CASE("NCCL metadata block: source token indices exactly in the expert layouts, before the scales", "[nccl]") {
  const moe_ep::Layout rank_major = expert_layout_of(MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_SCALES_ROW_MAJOR, 4, 1);
  const moe_ep::kernels::NcclShape r = moe_ep::nccl_shape(rank_major);
  CHECK(r.source_tokens == 0);
  for (const int32_t layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    const moe_ep::Layout l = expert_layout_of(layout, MOE_EP_SCALES_ROW_MAJOR, 4, 1);
    const moe_ep::kernels::NcclShape s = moe_ep::nccl_shape(l);
    CHECK(s.source_tokens == 1);
    for (const int64_t tpr : {int64_t{512}, int64_t{33}, int64_t{1}}) {
      INFO("layout " << layout << ", tokens_per_rank " << tpr);
      const int64_t header = 4 * moe_ep::kernels::nccl_header_ints(s);
      CHECK(moe_ep::kernels::nccl_meta_ids_offset(s) == header);
      CHECK(moe_ep::kernels::nccl_meta_weights_offset(s, tpr) == header + tpr * 8 * 4);
      CHECK(moe_ep::kernels::nccl_meta_tokens_offset(s, tpr) == header + tpr * 8 * 8);
      CHECK(moe_ep::kernels::nccl_meta_scales_offset(s, tpr) == header + tpr * 8 * 8 + tpr * 4);
      CHECK(moe_ep::kernels::nccl_meta_tokens_offset(s, tpr) % 4 == 0);
      CHECK(moe_ep::kernels::nccl_meta_bytes(s, tpr) == header + tpr * (8 * 8 + 4 + 56 * 4));
      // Exactly tpr int32 more than the rank-major block of the same rows.
      CHECK(moe_ep::kernels::nccl_meta_bytes(s, tpr) - moe_ep::kernels::nccl_meta_bytes(r, tpr) == 4 * tpr);
      CHECK(moe_ep::kernels::nccl_meta_scales_offset(r, tpr) == moe_ep::kernels::nccl_meta_tokens_offset(r, tpr));
    }
    // The plan sizes the blocks as the kernels lay them out.
    const moe_ep::NcclWorkspacePlan plan = moe_ep::plan_nccl_workspace(l);
    CHECK(plan.meta_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_meta_stride(s)));
    CHECK(plan.meta_gap == static_cast<uint64_t>(moe_ep::kernels::nccl_meta_gap(s)));
    CHECK(plan.send_segment_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_send_segment_stride(s)));
    CHECK(plan.meta_stride >= static_cast<uint64_t>(moe_ep::kernels::nccl_meta_bytes(s, 512)));
  }
}

// The expert layouts' regions come after every rank-major one (a rank-major
// plan is what it was: the new regions take no bytes there), each aligned,
// in order, without overlap, and counted in the workspace size.
TEST_CASE("NCCL buffer plan: the expert layouts' regions, disjoint, aligned and counted; none for RANK_MAJOR",
          "[nccl]") {
  const moe_ep::Layout rank_major = expert_layout_of(MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_SCALES_ROW_MAJOR, 4, 1);
  const moe_ep::NcclWorkspacePlan r = moe_ep::plan_nccl_workspace(rank_major);
  CHECK(r.recv_tokens == r.total_bytes);
  CHECK(r.expert.hidden == 0);  // not placed at all (gpu/expert_rows_plan.hpp)
  CHECK(r.expert.ticket == 0);
  CHECK(r.expert_combine_rows == r.total_bytes);
  std::vector<char> fake(16);
  CHECK(moe_ep::nccl_buffers_at(fake.data(), r, rank_major).recv_tokens == nullptr);
  CHECK(moe_ep::nccl_expert_rows_at(fake.data(), r, rank_major).hidden == nullptr);
  CHECK(moe_ep::nccl_expert_rows_at(fake.data(), r, rank_major).ticket == nullptr);

  for (const int32_t layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    for (const int32_t scales : {MOE_EP_SCALES_ROW_MAJOR, MOE_EP_SCALES_COLUMN_MAJOR}) {
      INFO("layout " << layout << ", scale layout " << scales);
      const moe_ep::Layout l = expert_layout_of(layout, scales, 4, 1);
      const moe_ep::NcclWorkspacePlan p = moe_ep::plan_nccl_workspace(l);
      const uint64_t receive = 4 * 512, rows = static_cast<uint64_t>(l.expert_layout_rows());
      const uint64_t scale_bytes = scales == MOE_EP_SCALES_COLUMN_MAJOR
                                       ? static_cast<uint64_t>(l.expert_scale_elems()) * 4
                                       : rows * l.scale_row_bytes;
      const uint64_t E = static_cast<uint64_t>(l.experts_per_rank());
      // The rank-major regions come first and are where a rank-major plan of
      // the same rows puts them, but for the longer metadata blocks.
      CHECK(p.recv_hidden % 256 == 0);
      CHECK(p.recv_tokens >= p.combine_input);
      // Each region after the one before, holding its bytes, 256-byte aligned.
      const std::vector<std::pair<uint64_t, uint64_t>> regions = {
          {p.recv_tokens, receive * 4},
          {p.expert.hidden, rows * l.hidden_row_bytes},
          {p.expert.scales, scale_bytes},
          {p.expert.counts, E * 4},
          {p.expert.offsets, (E + 1) * 4},
          {p.expert.sources, rows * 3 * 4},
          {p.expert.weights, rows * 4},
          {p.expert.dropped, 4},
          {p.expert.pick_ranks, receive * 8 * 4},
          {p.expert.tile_counts,
           static_cast<uint64_t>(moe_ep::kernels::expert_layout_tiles(static_cast<int64_t>(receive))) * E * 4},
          {p.expert.token_rows, receive * 8 * 4},
          {p.expert.ticket, 4},
          {p.expert_combine_rows, receive * l.combine_row_bytes},
      };
      for (size_t i = 0; i < regions.size(); ++i) {
        INFO("region " << i);
        CHECK(regions[i].first % 256 == 0);
        const uint64_t end = regions[i].first + regions[i].second;
        CHECK(end <= (i + 1 < regions.size() ? regions[i + 1].first : p.total_bytes));
      }
      CHECK(p.total_bytes % 256 == 0);
      // Counted: the workspace size is the plan, per slot.
      CHECK(moe_ep::nccl_workspace_bytes(l) == p.total_bytes);
      CHECK(moe_ep::nccl_workspace_bytes(l, 2) == 2 * p.total_bytes);
      moe_ep_config_t c = moe_ep::read_config(nullptr);
      c.micro_batches = 2;
      CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).workspace_bytes(l, c) == 2 * p.total_bytes);
      // The buffers the backend hands the kernels are those regions.
      std::vector<char> base(16);
      char* b = base.data();
      const moe_ep::kernels::NcclBuffers nb = moe_ep::nccl_buffers_at(b, p, l);
      const moe_ep::kernels::ExpertRowsBuffers x = moe_ep::nccl_expert_rows_at(b, p, l);
      CHECK(reinterpret_cast<char*>(nb.recv_tokens) == b + p.recv_tokens);
      CHECK(static_cast<char*>(x.hidden) == b + p.expert.hidden);
      CHECK(static_cast<char*>(x.scales) == b + p.expert.scales);
      CHECK(reinterpret_cast<char*>(x.counts) == b + p.expert.counts);
      CHECK(reinterpret_cast<char*>(x.sources) == b + p.expert.sources);
      CHECK(reinterpret_cast<char*>(x.token_rows) == b + p.expert.token_rows);
      CHECK(reinterpret_cast<char*>(x.ticket) == b + p.expert.ticket);
    }
  }
}

TEST_CASE("NCCL backend table: the expert layouts and both FP8 wires are taken", "[nccl]") {
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).expert_layouts);
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).fp8_dispatch_wire);
  CHECK(moe_ep::backend_entry(MOE_EP_BACKEND_NCCL).fp8_combine_wire);
  for (const int32_t layout : {MOE_EP_LAYOUT_EXPERT_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    const moe_ep::Layout l = expert_layout_of(layout, MOE_EP_SCALES_COLUMN_MAJOR, 2, 0);
    CHECK_NOTHROW(moe_ep::check_backend_capabilities(MOE_EP_BACKEND_NCCL, l, 2));
    moe_ep::Layout fp8 = l;
    fp8.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
    CHECK_NOTHROW(moe_ep::check_backend_capabilities(MOE_EP_BACKEND_NCCL, fp8, 1));
  }
}

namespace {

// A bf16 layout of hidden size `hidden` with the FP8 wires asked for.
moe_ep::Layout wire_layout_of(int32_t hidden, bool dispatch, bool dequantize, bool combine, int32_t receive_layout,
                              int32_t world, int32_t rank) {
  moe_ep_params_t params = moe_ep_test::make_params(64, 8, 512, hidden);
  params.receive_layout = receive_layout;
  if (receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) params.expert_alignment = 128;
  if (dispatch) params.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  params.dispatch_dequantize = dequantize ? 1 : 0;
  if (combine) params.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  return moe_ep::make_layout(moe_ep::read_params(&params), world, rank);
}

}  // namespace

// The combine wire's row: codes, then fp32 scales, each 16-byte rounded.
TEST_CASE("NCCL FP8 combine wire: a row is the codes then the scales, 16-byte aligned", "[nccl]") {
  for (const int32_t hidden : {7168, 100, 1, 129}) {
    INFO("hidden " << hidden);
    const moe_ep::kernels::NcclShape s =
        moe_ep::nccl_shape(wire_layout_of(hidden, false, false, true, MOE_EP_LAYOUT_RANK_MAJOR, 4, 1));
    CHECK(s.fp8_combine == 1);
    const int64_t codes = (hidden + 15) / 16 * 16, scales = ((hidden + 127) / 128 * 4 + 15) / 16 * 16;
    CHECK(moe_ep::kernels::nccl_combine_wire_scales_offset(s) == codes);
    CHECK(moe_ep::kernels::nccl_combine_wire_row_bytes(s) == codes + scales);
    CHECK(moe_ep::kernels::nccl_combine_transfer_row_bytes(s) == codes + scales);
    const moe_ep::kernels::NcclShape as_is =
        moe_ep::nccl_shape(wire_layout_of(hidden, false, false, false, MOE_EP_LAYOUT_RANK_MAJOR, 4, 1));
    CHECK(as_is.fp8_combine == 0);
    CHECK(moe_ep::kernels::nccl_combine_transfer_row_bytes(as_is) == 2 * hidden);
  }
  // DeepSeek's rows: 7168 codes and 56 scales, 7392 bytes against 14336 of bf16.
  const moe_ep::kernels::NcclShape d =
      moe_ep::nccl_shape(wire_layout_of(7168, false, false, true, MOE_EP_LAYOUT_RANK_MAJOR, 2, 0));
  CHECK(moe_ep::kernels::nccl_combine_wire_row_bytes(d) == 7392);
}

// With an FP8 dispatch wire the rows cross as wire_layout says (R bytes of
// codes, ceil(R / 128) fp32 scales in the metadata), and the wire's own
// buffers come last, each holding its bytes, disjoint, aligned and counted.
TEST_CASE("NCCL buffer plan: the FP8 wire's rows and buffers, disjoint, aligned and counted", "[nccl]") {
  const moe_ep::Layout as_is = wire_layout_of(7168, false, false, false, MOE_EP_LAYOUT_RANK_MAJOR, 4, 1);
  const moe_ep::NcclWorkspacePlan a = moe_ep::plan_nccl_workspace(as_is);
  CHECK(a.wire_codes == a.total_bytes);
  CHECK(a.combine_wire == a.total_bytes);
  std::vector<char> fake(16);
  const moe_ep::NcclWireBuffers none = moe_ep::nccl_wire_buffers_at(fake.data(), a, as_is);
  CHECK(none.codes == nullptr);
  CHECK(none.scales == nullptr);
  CHECK(none.dequantized == nullptr);
  CHECK(none.combine_rows == nullptr);

  for (const int32_t layout : {MOE_EP_LAYOUT_RANK_MAJOR, MOE_EP_LAYOUT_EXPERT_PACKED}) {
    for (const bool dequantize : {false, true}) {
      INFO("layout " << layout << ", dequantize " << dequantize);
      const moe_ep::Layout l = wire_layout_of(7168, true, dequantize, true, layout, 4, 1);
      const moe_ep::NcclWorkspacePlan p = moe_ep::plan_nccl_workspace(l);
      const moe_ep::kernels::NcclShape s = moe_ep::nccl_shape(l);
      // The rows cross as e4m3 codes with 56 fp32 scales each.
      CHECK(s.hidden_row_bytes == 7168);
      CHECK(s.scale_row_bytes == 56 * 4);
      CHECK(s.fp8_combine == 1);
      CHECK(p.meta_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_meta_stride(s)));
      CHECK(p.send_segment_stride == static_cast<uint64_t>(moe_ep::kernels::nccl_send_segment_stride(s)));
      const uint64_t receive = 4 * 512;
      CHECK(p.recv_scales - p.recv_hidden >= receive * 7168);
      CHECK(p.recv_ids - p.recv_scales >= receive * 56 * 4);
      // The shared send / combine-input region holds the wire rows combine receives.
      CHECK(p.local_slots - p.combine_in >= receive * 7392);
      const std::vector<std::pair<uint64_t, uint64_t>> regions = {
          {p.expert_combine_rows, layout == MOE_EP_LAYOUT_RANK_MAJOR ? 0 : receive * l.combine_row_bytes},
          {p.wire_codes, 512 * 7168},
          {p.wire_scales, 512 * 56 * 4},
          {p.dequantized, dequantize ? receive * 7168 * 2 : 0},
          {p.combine_wire, receive * 7392},
      };
      for (size_t i = 0; i < regions.size(); ++i) {
        INFO("region " << i);
        CHECK(regions[i].first % 256 == 0);
        CHECK(regions[i].first + regions[i].second <= (i + 1 < regions.size() ? regions[i + 1].first : p.total_bytes));
      }
      if (dequantize) CHECK(p.dequantized > p.wire_scales);
      CHECK(moe_ep::nccl_workspace_bytes(l) == p.total_bytes);
      CHECK(moe_ep::nccl_workspace_bytes(l, 2) == 2 * p.total_bytes);
      // The buffers the backend hands the kernels are those regions.
      std::vector<char> base(16);
      char* b = base.data();
      const moe_ep::NcclWireBuffers w = moe_ep::nccl_wire_buffers_at(b, p, l);
      CHECK(reinterpret_cast<char*>(w.codes) == b + p.wire_codes);
      CHECK(reinterpret_cast<char*>(w.scales) == b + p.wire_scales);
      CHECK(w.dequantized == (dequantize ? b + p.dequantized : nullptr));
      CHECK(w.combine_rows == b + p.combine_wire);
      CHECK(moe_ep::nccl_buffers_at(b, p, l).recv_scales == b + p.recv_scales);
      // An expert layout's results have the received rows' shape: codes and
      // scales, or with dispatch_dequantize bf16 rows without scales.
      if (layout != MOE_EP_LAYOUT_RANK_MAJOR) {
        const moe_ep::kernels::ExpertRowsBuffers x = moe_ep::nccl_expert_rows_at(b, p, l);
        CHECK((x.scales == nullptr) == dequantize);
        CHECK(p.expert.scales - p.expert.hidden >=
              static_cast<uint64_t>(l.expert_layout_rows()) * (dequantize ? 7168 * 2 : 7168));
      }
    }
  }
}
