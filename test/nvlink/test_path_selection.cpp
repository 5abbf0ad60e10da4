// The NVLink backend's path selectors (src/nvlink/path_selection.hpp): the
// path each call takes from the settings create read and the call's size and
// tensors, and the settings read from the knobs.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "combine/pull_rows_schedule.h"
#include "common/tuning_registry.hpp"
#include "error.hpp"
#include "moe_ep_c.h"
#include "moe_ep_kernels.h"
#include "nvlink/path_selection.hpp"
#include "scoped_environment.hpp"

using Catch::Matchers::Contains;
using moe_ep::CombinePathCall;
using moe_ep::DispatchPathCall;
using moe_ep::NvlinkPathSettings;
using moe_ep_test::ScopedEnvironment;

static_assert(moe_ep::kernels::kPullRowMaxBytes == moe_ep::kernels::kRowMaxBytes,
              "the host's pull-row bound is the kernel's");
static_assert(moe_ep::kernels::kPullMaxProducers == moe_ep::kernels::kRowMaxProducers,
              "MOE_EP_PULL_PRODUCERS' bound is the kernel's");

namespace {

alignas(16) char g_rows[64];
const void* const kAligned = g_rows;
const void* const kUnaligned = g_rows + 4;

NvlinkPathSettings defaults() {
  NvlinkPathSettings s;
  s.small_batch = true;
  s.small_dispatch_tokens = 512;
  s.small_combine_tokens = 384;
  s.dispatch_bulk = false;
  s.combine_schedule = moe_ep::kernels::kCombineAuto;
  s.pull_rows = true;
  s.bulk_copies = true;
  s.pdl = true;
  s.quantize_in_send = true;
  return s;
}

DispatchPathCall dispatch_call(int32_t tokens, int32_t blocks, const void* hidden = kAligned,
                               int64_t row_bytes = 14336) {
  DispatchPathCall c;
  c.num_tokens = tokens;
  c.tokens_per_rank = tokens;
  c.num_blocks = blocks;
  c.hidden_row_bytes = row_bytes;
  c.hidden = hidden;
  return c;
}

// A combine of 2 ranks of 132 SMs each.
CombinePathCall combine_call(bool zero_copy, int32_t tokens, const void* expert_output = kAligned,
                             int64_t row_bytes = 14336) {
  CombinePathCall c;
  c.zero_copy_combine = zero_copy;
  c.world_size = 2;
  c.group_min_sm_budget = 132;
  c.tokens_per_rank = tokens;
  c.combine_row_bytes = row_bytes;
  c.expert_output = expert_output;
  c.output = kAligned;
  return c;
}

}  // namespace

TEST_CASE("dispatch path: small-batch kernel up to its bound, else look-back for large calls on small grids",
          "[path]") {
  const NvlinkPathSettings s = defaults();
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(1, 1)) == MOE_EP_PATH_DISPATCH_SMALL);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(512, 16)) == MOE_EP_PATH_DISPATCH_SMALL);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(513, 16)) == MOE_EP_PATH_DISPATCH_SCAN);
  const int32_t min_tokens = moe_ep::kLookbackMinTokens, max_blocks = moe_ep::kLookbackMaxBlocks;
  for (const int32_t tokens : {1024, min_tokens, min_tokens + 1, 4096}) {
    for (const int32_t blocks : {1, 8, max_blocks, max_blocks + 1, 132}) {
      INFO("tokens " << tokens << ", blocks " << blocks);
      const bool lookback = tokens > min_tokens && blocks <= max_blocks;
      CHECK(moe_ep::select_dispatch_path(s, dispatch_call(tokens, blocks)) ==
            (lookback ? MOE_EP_PATH_DISPATCH_LOOKBACK : MOE_EP_PATH_DISPATCH_SCAN));
    }
  }
  NvlinkPathSettings lower = s;
  lower.small_dispatch_tokens = 200;
  CHECK(moe_ep::select_dispatch_path(lower, dispatch_call(200, 4)) == MOE_EP_PATH_DISPATCH_SMALL);
  CHECK(moe_ep::select_dispatch_path(lower, dispatch_call(201, 4)) == MOE_EP_PATH_DISPATCH_SCAN);
  NvlinkPathSettings off = s;
  off.small_batch = false;
  CHECK(moe_ep::select_dispatch_path(off, dispatch_call(1, 1)) == MOE_EP_PATH_DISPATCH_SCAN);
}

TEST_CASE("dispatch path: a forced look-back or scan, and bulk rows only for aligned rows", "[path]") {
  NvlinkPathSettings s = defaults();
  s.dispatch_lookback = true;
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(1024, 132)) == MOE_EP_PATH_DISPATCH_LOOKBACK);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(64, 4)) == MOE_EP_PATH_DISPATCH_SMALL);  // not affected
  s.dispatch_lookback = false;
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(4096, 8)) == MOE_EP_PATH_DISPATCH_SCAN);
  s.dispatch_lookback.reset();
  s.dispatch_bulk = true;
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(64, 4)) == MOE_EP_PATH_DISPATCH_SMALL_BULK);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(1024, 8)) == MOE_EP_PATH_DISPATCH_SCAN_BULK);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(4096, 8)) == MOE_EP_PATH_DISPATCH_LOOKBACK_BULK);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(64, 4, kUnaligned)) == MOE_EP_PATH_DISPATCH_SMALL);
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(4096, 8, kAligned, 14)) == MOE_EP_PATH_DISPATCH_LOOKBACK);
  for (const int32_t path :
       {MOE_EP_PATH_DISPATCH_SMALL_BULK, MOE_EP_PATH_DISPATCH_SCAN_BULK, MOE_EP_PATH_DISPATCH_LOOKBACK_BULK}) {
    CHECK(moe_ep::dispatch_path_is_bulk(path));
  }
  CHECK_FALSE(moe_ep::dispatch_path_is_bulk(MOE_EP_PATH_DISPATCH_LOOKBACK));
  CHECK(moe_ep::dispatch_path_is_small(MOE_EP_PATH_DISPATCH_SMALL_BULK));
  CHECK_FALSE(moe_ep::dispatch_path_is_small(MOE_EP_PATH_DISPATCH_SCAN));
  CHECK(moe_ep::dispatch_path_looks_back(MOE_EP_PATH_DISPATCH_LOOKBACK_BULK));
  CHECK_FALSE(moe_ep::dispatch_path_looks_back(MOE_EP_PATH_DISPATCH_SMALL));
}

TEST_CASE("dispatch path: the FP8 wire encoded in the send loop only for aligned rows, else quantized first",
          "[path]") {
  NvlinkPathSettings s = defaults();
  const auto fp8 = [](int32_t tokens, int32_t blocks, const void* hidden = kAligned, int64_t code_bytes = 7168) {
    DispatchPathCall c = dispatch_call(tokens, blocks, hidden, code_bytes);
    c.fp8_wire = true;
    return c;
  };
  CHECK(moe_ep::select_dispatch_path(s, fp8(128, 8)) == MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE);
  CHECK(moe_ep::select_dispatch_path(s, fp8(1024, 132)) == MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE);
  CHECK(moe_ep::select_dispatch_path(s, fp8(4096, 8)) == MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE);
  // Unaligned caller rows or code rows that are not whole vectors: the
  // separate quantize kernel, then the paths of any rows.
  CHECK(moe_ep::select_dispatch_path(s, fp8(128, 8, kUnaligned)) == MOE_EP_PATH_DISPATCH_SMALL);
  CHECK(moe_ep::select_dispatch_path(s, fp8(4096, 8, kAligned, 7176)) == MOE_EP_PATH_DISPATCH_LOOKBACK);
  // The quantized codes are aligned workspace rows: bulk copies take them
  // whatever the caller's alignment, when their rows are whole vectors.
  s.dispatch_bulk = true;
  CHECK(moe_ep::select_dispatch_path(s, fp8(128, 8)) == MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE);
  CHECK(moe_ep::select_dispatch_path(s, fp8(128, 8, kUnaligned)) == MOE_EP_PATH_DISPATCH_SMALL_BULK);
  CHECK(moe_ep::select_dispatch_path(s, fp8(128, 8, kUnaligned, 7176)) == MOE_EP_PATH_DISPATCH_SMALL);
  s.quantize_in_send = false;
  CHECK(moe_ep::select_dispatch_path(s, fp8(1024, 132)) == MOE_EP_PATH_DISPATCH_SCAN_BULK);
  s.dispatch_bulk = false;
  CHECK(moe_ep::select_dispatch_path(s, fp8(4096, 8)) == MOE_EP_PATH_DISPATCH_LOOKBACK);
  // AS_IS rows never take a quantizing path.
  s.quantize_in_send = true;
  CHECK(moe_ep::select_dispatch_path(s, dispatch_call(128, 8)) == MOE_EP_PATH_DISPATCH_SMALL);
  for (const int32_t path : {MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE, MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE,
                             MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE}) {
    CHECK(moe_ep::dispatch_path_quantizes(path));
    CHECK_FALSE(moe_ep::dispatch_path_is_bulk(path));
  }
  CHECK_FALSE(moe_ep::dispatch_path_quantizes(MOE_EP_PATH_DISPATCH_SMALL_BULK));
  CHECK(moe_ep::dispatch_path_is_small(MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE));
  CHECK_FALSE(moe_ep::dispatch_path_is_small(MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE));
  CHECK(moe_ep::dispatch_path_looks_back(MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE));
  CHECK_FALSE(moe_ep::dispatch_path_looks_back(MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE));
}

TEST_CASE(
    "combine path: the pull with the zero-copy view, by row size and alignment; else the push schedule, "
    "small push up to its bound",
    "[path]") {
  using moe_ep::kernels::kCombineOverlapped;
  using moe_ep::kernels::kCombineSerial;
  NvlinkPathSettings s = defaults();
  CHECK(moe_ep::select_combine_path(s, combine_call(false, 384)) == MOE_EP_PATH_COMBINE_SMALL_PUSH);
  CHECK(moe_ep::select_combine_path(s, combine_call(false, 385)) == MOE_EP_PATH_COMBINE_SERIAL_PUSH);
  // auto: overlapped for calls of at least kOverlapMinTokens on groups of at least kOverlapMinBlocks SMs.
  CHECK(moe_ep::select_combine_path(s, combine_call(false, moe_ep::kernels::kOverlapMinTokens)) ==
        MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH);
  CombinePathCall few_sms = combine_call(false, 4096);
  few_sms.group_min_sm_budget = moe_ep::kernels::kOverlapMinBlocks - 1;
  CHECK(moe_ep::select_combine_path(s, few_sms) == MOE_EP_PATH_COMBINE_SERIAL_PUSH);
  CombinePathCall one_rank = combine_call(true, 4096);  // the view, but no peer to pull from
  one_rank.world_size = 1;
  CHECK(moe_ep::select_combine_path(s, one_rank) == MOE_EP_PATH_COMBINE_SERIAL_PUSH);
  NvlinkPathSettings overlapped = s;
  overlapped.combine_schedule = kCombineOverlapped;
  CHECK(moe_ep::select_combine_path(overlapped, combine_call(false, 8)) == MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH);
  NvlinkPathSettings serial = s;
  serial.combine_schedule = kCombineSerial;
  CHECK(moe_ep::select_combine_path(serial, combine_call(false, 4096)) == MOE_EP_PATH_COMBINE_SERIAL_PUSH);

  CHECK(moe_ep::select_combine_path(s, combine_call(true, 8)) == MOE_EP_PATH_COMBINE_PULL_ROWS);
  CHECK(moe_ep::select_combine_path(s, combine_call(true, 4096)) == MOE_EP_PATH_COMBINE_PULL_ROWS);
  CHECK(moe_ep::select_combine_path(s, combine_call(true, 8, kAligned, 16384)) == MOE_EP_PATH_COMBINE_PULL_ROWS);
  CHECK(moe_ep::select_combine_path(s, combine_call(true, 8, kAligned, 16400)) == MOE_EP_PATH_COMBINE_PULL_SEGMENTS);
  CHECK(moe_ep::select_combine_path(s, combine_call(true, 8, kUnaligned)) == MOE_EP_PATH_COMBINE_PULL_UNALIGNED);
  CHECK(moe_ep::select_combine_path(s, combine_call(true, 8, kAligned, 200)) == MOE_EP_PATH_COMBINE_PULL_UNALIGNED);
  NvlinkPathSettings segments = s;
  segments.pull_rows = false;
  CHECK(moe_ep::select_combine_path(segments, combine_call(true, 8)) == MOE_EP_PATH_COMBINE_PULL_SEGMENTS);
  segments.bulk_copies = false;
  CHECK(moe_ep::select_combine_path(segments, combine_call(true, 8)) == MOE_EP_PATH_COMBINE_PULL_REGISTERS);

  NvlinkPathSettings bound = s;
  bound.small_combine_tokens = 512;
  CHECK(moe_ep::select_combine_path(bound, combine_call(false, 512)) == MOE_EP_PATH_COMBINE_SMALL_PUSH);
  bound.small_batch = false;
  CHECK(moe_ep::select_combine_path(bound, combine_call(false, 1)) == MOE_EP_PATH_COMBINE_SERIAL_PUSH);

  for (const int32_t path : {MOE_EP_PATH_COMBINE_PULL_ROWS, MOE_EP_PATH_COMBINE_PULL_SEGMENTS,
                             MOE_EP_PATH_COMBINE_PULL_REGISTERS, MOE_EP_PATH_COMBINE_PULL_UNALIGNED}) {
    CHECK(moe_ep::combine_path_pulls(path));
  }
  CHECK_FALSE(moe_ep::combine_path_pulls(MOE_EP_PATH_COMBINE_SMALL_PUSH));
  CHECK(moe_ep::combine_path_schedule(MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH) == kCombineOverlapped);
  CHECK(moe_ep::combine_path_schedule(MOE_EP_PATH_COMBINE_SMALL_PUSH) == kCombineSerial);
  CHECK(moe_ep::combine_path_schedule(MOE_EP_PATH_COMBINE_SERIAL_PUSH) == kCombineSerial);
}

TEST_CASE("path settings from the knobs: defaults, the bulk rows by SM budget, PDL and bulk copies by device",
          "[path]") {
  const ScopedEnvironment bulk("MOE_EP_DISPATCH_BULK", nullptr);
  const ScopedEnvironment lookback("MOE_EP_DISPATCH_LOOKBACK", nullptr);
  const ScopedEnvironment pdl("MOE_EP_PDL", nullptr);
  const ScopedEnvironment quantize("MOE_EP_QUANTIZE_IN_SEND", nullptr);
  {
    const NvlinkPathSettings s = moe_ep::read_nvlink_path_settings(90, 132);
    CHECK_FALSE(s.quantize_in_send);
    CHECK(s.small_batch);
    CHECK(s.small_dispatch_tokens == 512);
    CHECK(s.small_combine_tokens == 384);
    CHECK_FALSE(s.dispatch_bulk);
    CHECK_FALSE(s.dispatch_lookback.has_value());
    CHECK(s.combine_schedule == moe_ep::kernels::kCombineAuto);
    CHECK(s.pull_rows);
    CHECK(s.bulk_copies);
    CHECK(s.pdl);
  }
  for (const int32_t budget : {1, moe_ep::kDispatchBulkAutoMaxSms, moe_ep::kDispatchBulkAutoMaxSms + 1, 132}) {
    INFO("SM budget " << budget);
    CHECK(moe_ep::read_nvlink_path_settings(90, budget).dispatch_bulk == (budget <= moe_ep::kDispatchBulkAutoMaxSms));
    CHECK_FALSE(moe_ep::read_nvlink_path_settings(80, budget).dispatch_bulk);  // no bulk copies before 9.0
  }
  CHECK_FALSE(moe_ep::read_nvlink_path_settings(80, 132).pdl);
  CHECK_FALSE(moe_ep::read_nvlink_path_settings(80, 132).bulk_copies);
  {
    const ScopedEnvironment forced("MOE_EP_DISPATCH_BULK", "1");
    CHECK(moe_ep::read_nvlink_path_settings(90, 132).dispatch_bulk);
  }
  {
    const ScopedEnvironment forced("MOE_EP_DISPATCH_BULK", "off");
    CHECK_FALSE(moe_ep::read_nvlink_path_settings(90, 4).dispatch_bulk);
  }
  {
    const ScopedEnvironment forced("MOE_EP_DISPATCH_LOOKBACK", "0");
    CHECK(moe_ep::read_nvlink_path_settings(90, 132).dispatch_lookback == std::optional<bool>(false));
  }
  {
    const ScopedEnvironment off("MOE_EP_PDL", "0");
    CHECK_FALSE(moe_ep::read_nvlink_path_settings(90, 132).pdl);
  }
  {
    const ScopedEnvironment on("MOE_EP_QUANTIZE_IN_SEND", "1");
    CHECK(moe_ep::read_nvlink_path_settings(90, 132).quantize_in_send);
  }
  {
    const ScopedEnvironment bad("MOE_EP_DISPATCH_LOOKBACK", "junk");
    CHECK_THROWS_AS(moe_ep::read_nvlink_path_settings(90, 132), moe_ep::Error);
  }
}

TEST_CASE("path knobs: their documentation states the automatic choices' bounds", "[path]") {
  using moe_ep::Knob;
  using moe_ep::knob_spec;
  CHECK_THAT(knob_spec(Knob::kDispatchBulk).doc,
             Contains("at most " + std::to_string(moe_ep::kDispatchBulkAutoMaxSms)));
  CHECK_THAT(knob_spec(Knob::kDispatchLookback).doc,
             Contains("more than " + std::to_string(moe_ep::kLookbackMinTokens) + " tokens on at most " +
                      std::to_string(moe_ep::kLookbackMaxBlocks) + " blocks"));
  CHECK(knob_spec(Knob::kSmallDispatchTokens).max == moe_ep::kernels::kSmallDispatchMaxTokens);
  CHECK(knob_spec(Knob::kSmallCombineTokens).max == moe_ep::kernels::kSmallCombineMaxTokens);
  CHECK(knob_spec(Knob::kPullProducers).max == moe_ep::kernels::kPullMaxProducers);
}
