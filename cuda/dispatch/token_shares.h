// How a dispatch grid shares the rank's own tokens between its blocks
// (dispatch/dispatch.cu): plain C++ shared by the kernels, the host, which picks
// the shares for each call, and a host test
// (test/nvlink/test_dispatch_token_shares.cpp).  Blocks in the middle take
// equal shares; the first and the last block may take less:
// - the small-batch kernel's block 0 counts every pick (one round, one token
//   per thread) and sends the counts before its rows: about 1 us more than a
//   block in the middle, the bytes a block sends in 1 us at the per-SM rate
//   of 8 SMs (56 KB).  It takes 1 - g of a share, g = 56 KB over the bytes of
//   one share, (T / G) x row x d; g >= 1 (small calls, large grids): none, so
//   that its counts are never behind a row (a share of none at every size
//   would leave the other blocks more rows to send);
// - the general kernel's last block, when the call routes by scan
//   (DispatchLaunch::lookback 0), scans every token (the others only up to
//   their last, half of them on average) and counts every pick before its
//   rows.  It takes 1 - f of a share, f being that extra time over the time a
//   block spends sending one share of rows:
//     extra ≈ T x (top_k x 0.21 ns + 0.88 ns)   (a pick counted; half a scan
//                                                round of 512 tokens, 0.9 us,
//                                                per 512 tokens)
//     sends ≈ (T / G) x row x d / 56 GB/s        (a block's rows to d
//                                                destinations at the per-SM
//                                                rate of 8 SMs)
//     f = extra / sends ≈ G x (top_k x 11.8 + 49) / (row x d)
//   with G blocks, row = the bytes sent per token and destination (hidden
//   row, scale row, ids and weights), d = min(world, top_k).  f >= 1: it owns
//   no token.
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// Shares are given in 1/kTokenShareUnit of a block in the middle's.
constexpr int32_t kTokenShareUnit = 256;

// 0.21 ns per pick and 0.88 ns per token x 56 GB/s, in bytes (see above).
constexpr double kScanLastBytesPerPick = 11.8;
constexpr double kScanLastBytesPerToken = 49.0;

// The scan's last block's share of the own tokens, in [0, kTokenShareUnit].
MOE_EP_HOST_DEVICE int32_t scan_last_block_share(int32_t blocks, int32_t top_k, int64_t bytes_per_destination,
                                                 int32_t world_size) {
  if (blocks <= 1) return kTokenShareUnit;  // the only block sends everything
  const int64_t destinations = world_size < top_k ? world_size : top_k;
  const double sends = static_cast<double>(bytes_per_destination) * static_cast<double>(destinations);
  const double extra = static_cast<double>(blocks) * (top_k * kScanLastBytesPerPick + kScanLastBytesPerToken);
  if (sends <= 0.0 || extra >= sends) return 0;
  return static_cast<int32_t>(static_cast<double>(kTokenShareUnit) * (1.0 - extra / sends));
}

// 1 us of a block's sends at 56 GB/s, in bytes (see above).
constexpr double kSmallFirstExtraBytes = 56000.0;

// The small-batch kernel's block 0's share of the own tokens, in
// [0, kTokenShareUnit].
MOE_EP_HOST_DEVICE int32_t small_first_block_share(int32_t blocks, int32_t num_tokens, int32_t top_k,
                                                   int64_t bytes_per_destination, int32_t world_size) {
  if (blocks <= 1) return kTokenShareUnit;  // the only block sends everything
  const int64_t destinations = world_size < top_k ? world_size : top_k;
  const double sends = static_cast<double>(num_tokens) / blocks * static_cast<double>(bytes_per_destination) *
                       static_cast<double>(destinations);
  if (sends <= kSmallFirstExtraBytes) return 0;
  return static_cast<int32_t>(static_cast<double>(kTokenShareUnit) * (1.0 - kSmallFirstExtraBytes / sends));
}

// The own tokens [*t0, *t1) of block `block` of `blocks`: the first block
// takes `share_first` / kTokenShareUnit of what a block in the middle takes,
// the last `share_last` / kTokenShareUnit; a lone block takes every token.
// Together the ranges cover [0, T) in block order, each token once.
MOE_EP_HOST_DEVICE void own_token_range(int32_t T, int32_t blocks, int32_t block, int32_t share_first,
                                        int32_t share_last, int32_t* t0, int32_t* t1) {
  const int64_t total = static_cast<int64_t>(blocks - 2) * kTokenShareUnit + share_first + share_last;
  if (blocks <= 1 || total <= 0) {  // a lone block, or two that own nothing: every token to the last
    *t0 = 0;
    *t1 = block == blocks - 1 ? T : 0;
    return;
  }
  const int64_t begin = block == 0 ? 0 : share_first + static_cast<int64_t>(block - 1) * kTokenShareUnit;
  const int64_t end = block == blocks - 1 ? total : share_first + static_cast<int64_t>(block) * kTokenShareUnit;
  *t0 = static_cast<int32_t>(T * begin / total);
  *t1 = static_cast<int32_t>(T * end / total);
}

}  // namespace kernels
}  // namespace moe_ep
