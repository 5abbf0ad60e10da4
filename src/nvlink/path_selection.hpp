// The NVLink backend's path selectors: which kernels and schedule a dispatch
// or a combine runs (MOE_EP_PATH_*), decided here and only here.  The launch
// structs carry the choice to the device, which takes it as it is.  The
// settings come from the tuning registry at create; the calls' sizes and
// tensors decide the rest.  Results are the same on every path.
#pragma once

#include <stdint.h>

#include <optional>

namespace moe_ep {

// What create decides once per handle.
struct NvlinkPathSettings {
  bool small_batch = true;                 // MOE_EP_SMALL_BATCH
  int32_t small_dispatch_tokens = 0;       // MOE_EP_SMALL_DISPATCH_TOKENS
  int32_t small_combine_tokens = 0;        // MOE_EP_SMALL_COMBINE_TOKENS
  bool dispatch_bulk = false;              // bulk-copy dispatch rows wanted (MOE_EP_DISPATCH_BULK, by SM budget)
  bool quantize_in_send = false;           // MOE_EP_QUANTIZE_IN_SEND
  std::optional<bool> dispatch_lookback;   // MOE_EP_DISPATCH_LOOKBACK forced it, or none (by the call)
  int32_t combine_schedule = 0;            // MOE_EP_COMBINE_SCHEDULE as requested (kernels::CombineSchedule)
  bool pull_rows = true;                   // MOE_EP_PULL_ROWS
  bool bulk_copies = false;                // the device runs the bulk-copy kernels (compute capability >= 9.0)
  bool pdl = false;                        // Programmatic Dependent Launch (MOE_EP_PDL, compute capability >= 9.0)
};

// Dispatch's bulk-copy rows are taken by default on SM budgets of at most
// this many SMs: there the copies save SM time that few SMs lack; on more SMs
// their latency costs more than they save.
constexpr int32_t kDispatchBulkAutoMaxSms = 8;

// The general dispatch routes by look-back, by default, for calls of more
// than kLookbackMinTokens tokens on grids of at most kLookbackMaxBlocks
// blocks: a block's own routing round is then short against the many rounds
// a late block scans.  Below that a scan is a few rounds, and on larger grids
// the scan's early blocks start their rows sooner, which the shared bandwidth
// rewards.
constexpr int32_t kLookbackMinTokens = 2048;
constexpr int32_t kLookbackMaxBlocks = 32;

// Reads the knobs (common/tuning_registry.hpp) for a device of compute
// capability `cc` (major * 10 + minor) with `sm_budget` SMs.
NvlinkPathSettings read_nvlink_path_settings(int32_t cc, int32_t sm_budget);

struct DispatchPathCall {
  int32_t num_tokens = 0;
  int32_t tokens_per_rank = 0;
  int32_t num_blocks = 0;        // the grid (kernels::dispatch_blocks)
  int64_t hidden_row_bytes = 0;  // the rows that cross (with the FP8 wire: the codes)
  const void* hidden = nullptr;  // the caller's rows (their alignment matters)
  bool fp8_wire = false;         // the FP8 dispatch wire: `hidden` holds the rows to encode; the paths
                                 // that do not encode them in the send loop send the codes of a separate
                                 // quantize kernel, from the workspace (16-byte aligned)
};
int32_t select_dispatch_path(const NvlinkPathSettings& s, const DispatchPathCall& call);
bool dispatch_path_is_small(int32_t path);
bool dispatch_path_is_bulk(int32_t path);
bool dispatch_path_looks_back(int32_t path);
// The FP8 wire encoded in the send loop (otherwise the codes are quantized first, where the wire is FP8).
bool dispatch_path_quantizes(int32_t path);

struct CombinePathCall {
  bool zero_copy_combine = false;  // config.zero_copy_combine (the same on every rank)
  int32_t world_size = 1;
  int32_t group_min_sm_budget = 0;  // the smallest SM budget of the group (agreed at create)
  int32_t tokens_per_rank = 0;
  int64_t combine_row_bytes = 0;
  const void* expert_output = nullptr;
  const void* output = nullptr;
  bool split = false;  // a split call (docs/overlap.md): its halves are a push and a wait, so the
                       // serial schedule; the same on every rank of a call (the collective rule)
};
// Every rank of a group takes a pull path, or every rank a push path of the
// same schedule (the schedule depends on group-wide values only).
int32_t select_combine_path(const NvlinkPathSettings& s, const CombinePathCall& call);
bool combine_path_pulls(int32_t path);
// The schedule of a push path (kernels::CombineSchedule; pull paths have none: serial).
int32_t combine_path_schedule(int32_t path);

}  // namespace moe_ep
