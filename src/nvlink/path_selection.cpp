#include "nvlink/path_selection.hpp"

#include <cstdint>

#include "common/tuning_registry.hpp"
#include "moe_ep_c.h"
#include "moe_ep_kernels.h"

namespace moe_ep {

static_assert(kernels::kPullMaxProducers == 4, "MOE_EP_PULL_PRODUCERS is declared as 1..4");
static_assert(kernels::kSmallDispatchMaxTokens == 512 && kernels::kSmallCombineMaxTokens == 512,
              "MOE_EP_SMALL_DISPATCH_TOKENS and MOE_EP_SMALL_COMBINE_TOKENS are declared as 1..512");

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

NvlinkPathSettings read_nvlink_path_settings(int32_t cc, int32_t sm_budget) {
  NvlinkPathSettings s;
  s.small_batch = knob_bool(Knob::kSmallBatch);
  s.small_dispatch_tokens = knob_int(Knob::kSmallDispatchTokens);
  s.small_combine_tokens = knob_int(Knob::kSmallCombineTokens);
  // Bulk copies need compute capability 9.0 (the build has 9.0 code for any
  // such device: CMAKE_CUDA_ARCHITECTURES is 90 and newer by default).
  s.bulk_copies = cc >= 90;
  s.dispatch_bulk = s.bulk_copies && knob_switch(Knob::kDispatchBulk).value_or(sm_budget <= kDispatchBulkAutoMaxSms);
  s.dispatch_lookback = knob_switch(Knob::kDispatchLookback);
  s.quantize_in_send = knob_bool(Knob::kQuantizeInSend);
  s.combine_schedule = knob_int(Knob::kCombineSchedule);
  s.pull_rows = knob_bool(Knob::kPullRows);
  s.pdl = cc >= 90 && knob_bool(Knob::kPdl);
  return s;
}

int32_t select_dispatch_path(const NvlinkPathSettings& s, const DispatchPathCall& call) {
  // Bulk copies need 16-byte aligned rows and sources; any other call keeps
  // the register path (which also takes rows of any size).  The send loop
  // encodes FP8 codes as 16-byte vectors of the caller's aligned rows; other
  // rows are quantized first, into aligned workspace rows.
  const bool rows16 = call.hidden_row_bytes % 16 == 0;
  const bool quantize = call.fp8_wire && s.quantize_in_send && rows16 && aligned16(call.hidden);
  const bool bulk = !quantize && s.dispatch_bulk && rows16 && (call.fp8_wire || aligned16(call.hidden));
  const auto variant = [&](int32_t registers, int32_t bulk_path, int32_t quantize_path) {
    return quantize ? quantize_path : bulk ? bulk_path : registers;
  };
  if (s.small_batch && call.tokens_per_rank <= s.small_dispatch_tokens &&
      call.tokens_per_rank <= kernels::kSmallDispatchMaxTokens) {
    return variant(MOE_EP_PATH_DISPATCH_SMALL, MOE_EP_PATH_DISPATCH_SMALL_BULK, MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE);
  }
  const bool lookback =
      s.dispatch_lookback.value_or(call.num_tokens > kLookbackMinTokens && call.num_blocks <= kLookbackMaxBlocks);
  if (lookback) {
    return variant(MOE_EP_PATH_DISPATCH_LOOKBACK, MOE_EP_PATH_DISPATCH_LOOKBACK_BULK,
                   MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE);
  }
  return variant(MOE_EP_PATH_DISPATCH_SCAN, MOE_EP_PATH_DISPATCH_SCAN_BULK, MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE);
}

bool dispatch_path_is_small(int32_t path) {
  return path == MOE_EP_PATH_DISPATCH_SMALL || path == MOE_EP_PATH_DISPATCH_SMALL_BULK ||
         path == MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE;
}

bool dispatch_path_is_bulk(int32_t path) {
  return path == MOE_EP_PATH_DISPATCH_SMALL_BULK || path == MOE_EP_PATH_DISPATCH_SCAN_BULK ||
         path == MOE_EP_PATH_DISPATCH_LOOKBACK_BULK;
}

bool dispatch_path_looks_back(int32_t path) {
  return path == MOE_EP_PATH_DISPATCH_LOOKBACK || path == MOE_EP_PATH_DISPATCH_LOOKBACK_BULK ||
         path == MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE;
}

bool dispatch_path_quantizes(int32_t path) {
  return path == MOE_EP_PATH_DISPATCH_SMALL_QUANTIZE || path == MOE_EP_PATH_DISPATCH_SCAN_QUANTIZE ||
         path == MOE_EP_PATH_DISPATCH_LOOKBACK_QUANTIZE;
}

int32_t select_combine_path(const NvlinkPathSettings& s, const CombinePathCall& call) {
  // With the zero-copy view every rank pulls its rows from the peers' views
  // (one rank has no peers: it pushes to itself).
  if (call.zero_copy_combine && call.world_size > 1) {
    const bool aligned = call.combine_row_bytes % 16 == 0 && aligned16(call.expert_output) && aligned16(call.output);
    if (!aligned) return MOE_EP_PATH_COMBINE_PULL_UNALIGNED;
    if (!s.bulk_copies) return MOE_EP_PATH_COMBINE_PULL_REGISTERS;
    return s.pull_rows && call.combine_row_bytes <= kernels::kPullRowMaxBytes ? MOE_EP_PATH_COMBINE_PULL_ROWS
                                                                           : MOE_EP_PATH_COMBINE_PULL_SEGMENTS;
  }
  // The overlapped schedule pushes and reduces at once: it has no halves.
  const int32_t schedule = call.split
                               ? kernels::kCombineSerial
                               : kernels::resolve_combine_schedule(s.combine_schedule, call.world_size,
                                                                   call.tokens_per_rank, call.group_min_sm_budget);
  if (schedule == kernels::kCombineOverlapped) return MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH;
  if (s.small_batch && call.tokens_per_rank <= s.small_combine_tokens &&
      call.tokens_per_rank <= kernels::kSmallCombineMaxTokens) {
    return MOE_EP_PATH_COMBINE_SMALL_PUSH;
  }
  return MOE_EP_PATH_COMBINE_SERIAL_PUSH;
}

bool combine_path_pulls(int32_t path) {
  return path == MOE_EP_PATH_COMBINE_PULL_ROWS || path == MOE_EP_PATH_COMBINE_PULL_SEGMENTS ||
         path == MOE_EP_PATH_COMBINE_PULL_REGISTERS || path == MOE_EP_PATH_COMBINE_PULL_UNALIGNED;
}

int32_t combine_path_schedule(int32_t path) {
  return path == MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH ? kernels::kCombineOverlapped : kernels::kCombineSerial;
}

}  // namespace moe_ep
