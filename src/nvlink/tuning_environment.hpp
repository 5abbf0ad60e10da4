// Per-rank tuning switches of the NVLink backend, read from the environment
// at create.  None changes what a peer sees, so ranks may differ in them
// (docs/api.md lists them with their measured effect):
//   MOE_EP_SMALL_BATCH=0   the small-batch kernels off (default on: dispatches
//                          of at most MOE_EP_SMALL_DISPATCH_TOKENS and combines
//                          of at most MOE_EP_SMALL_COMBINE_TOKENS tokens per
//                          rank run them, below);
//   MOE_EP_PDL=0           Programmatic Dependent Launch off (default on where
//                          the device has compute capability 9.0 or newer);
//   MOE_EP_PULL_ROWS=0     the pull combine copies 2 KiB segments instead of
//                          whole rows (rows of at most 16 KiB);
//   MOE_EP_PULL_COPY_BYTES=N, MOE_EP_PULL_PRODUCERS=N  below;
//   MOE_EP_PULL_LOADS=registers  with whole rows off, the pull combine loads
//                          into registers instead of bulk copies (a diagnostic);
//   MOE_EP_DISPATCH_BULK=1 / =0  dispatch moves 16-byte aligned hidden rows
//                          with bulk copies through shared memory (compute
//                          capability 9.0 and newer), or never; unset: below;
//   MOE_EP_DISPATCH_LOOKBACK=1 / =0  the general dispatch routes by look-back
//                          always, or never; unset: below.
#pragma once

#include <stdint.h>

#include <optional>

#include "gpu/environment.hpp"  // environment_switch, forced_switch, int_from_environment

namespace moe_ep {

// MOE_EP_PULL_COPY_BYTES: the whole-row pull brings each partial row in bulk
// copies of at most this many bytes, a multiple of 16 within 16..16384
// (default 16384: one copy per row, which measured best).
constexpr int32_t kDefaultPullCopyBytes = 16384;
int32_t pull_copy_bytes_from_environment();

// MOE_EP_PULL_PRODUCERS: producer warps per block of the whole-row pull, each
// issuing its own stream of bulk copies, 1..4 (default 2: best measured on 16
// SMs, docs/nvlink_backend.md v16).
constexpr int32_t kDefaultPullProducers = 2;
constexpr int32_t kMaxPullProducers = 4;
int32_t pull_producers_from_environment();

// MOE_EP_DISPATCH_BULK: "1" always, "0" never, unset (or anything else) when
// the rank's SM budget is at most kDispatchBulkAutoMaxSms, where the bulk
// path measured faster (2 H200, 4096 tokens: 8 SMs 314 against 346 us, 16 SMs
// 217 against 202; docs/nvlink_backend.md v11, v23).
constexpr int32_t kDispatchBulkAutoMaxSms = 8;
bool dispatch_bulk_from_environment(int32_t sm_budget);

// MOE_EP_SMALL_DISPATCH_TOKENS: dispatches of at most this many tokens per
// rank run the small-batch kernel (while MOE_EP_SMALL_BATCH is on), 1 to
// kMaxSmallDispatchTokens (the kernel's one routing round: one token per
// thread of its 512-thread blocks); unset or not a positive number: the
// default, the whole range, where the small kernel measured faster at every
// size (one H200, one rank: 0.9-1.0 us less at 192-384 tokens, 0.4 at 512;
// docs/nvlink_backend.md v32).
constexpr int32_t kDefaultSmallDispatchTokens = 512;
constexpr int32_t kMaxSmallDispatchTokens = 512;
int32_t small_dispatch_tokens_from_environment();

// MOE_EP_SMALL_COMBINE_TOKENS: combines (serial push schedule) of at most this
// many tokens per rank run the small-batch kernel, 1 to kMaxSmallCombineTokens
// (its static (peer, slot, segment) push items grow with tokens_per_rank, not
// with the rows sent); unset or not a positive number: the default, 384.  On
// one H200 the small kernel measured faster at every size up to 512 (0.2-0.4
// us on one rank, 0.7 / 1.2 / 0.2 us in the two-rank proxy's push at 192 /
// 256 / 512), on 2 H200 0.25-0.33 us faster at 192-384 tokens but 0.7 us
// slower at 512 (docs/nvlink_backend.md v33).
constexpr int32_t kDefaultSmallCombineTokens = 384;
constexpr int32_t kMaxSmallCombineTokens = 512;
int32_t small_combine_tokens_from_environment();

// MOE_EP_DISPATCH_LOOKBACK: whether a general-kernel dispatch routes by
// look-back (each block its own tokens, then the earlier blocks' counts) or by
// scan (each block every token up to its last).  "1" always, "0" never, unset
// (or anything else) for calls of more than kLookbackMinTokens tokens on grids
// of at most kLookbackMaxBlocks blocks, where the look-back measured faster on
// the one-GPU proxy: there a block's own routing round is short against the
// 5+ rounds a late block scans.  Below that a scan is at most a few rounds, and
// on larger grids the scan's early blocks start their rows sooner, which the
// shared bandwidth rewards (docs/nvlink_backend.md v27: 66 SMs 2-4 us faster
// by scan at 1024-4096 tokens; 8-24 SMs at 4096 up to 9 us faster by
// look-back).  Ranks may differ: nothing a peer sees does.
constexpr int32_t kLookbackMinTokens = 2048;
constexpr int32_t kLookbackMaxBlocks = 32;
std::optional<bool> dispatch_lookback_from_environment();  // forced_switch: none = by the call
bool dispatch_looks_back(std::optional<bool> forced, int32_t num_tokens, int32_t blocks);

}  // namespace moe_ep
