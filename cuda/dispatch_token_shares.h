// How a dispatch grid shares the rank's own tokens between its blocks
// (dispatch_kernel.cu): plain C++ shared by the host, which picks block 0's
// share for each call, and a host test (test/nvlink/test_dispatch_token_shares.cpp).
//
// Block 0 does more than the others: before its rows it counts every pick of
// every token (top_k shared-memory atomics per token, with the bad-id checks)
// and sends the counts, and after them it waits for every rank.  With an even
// split it was the last block to publish (docs/nvlink_backend.md, v24-v25).
// So it takes 1 - f of a share, f being its extra routing time over the time a
// block spends sending one share of rows:
//   extra ≈ T x top_k x 0.21 ns               (6-8 us for 4096 x 8 picks, measured)
//   sends ≈ (T / G) x row x d / 56 GB/s        (a block's rows to d destinations
//                                               at the per-SM rate of 8 SMs)
//   f = extra / sends ≈ G x top_k x 11.8 / (row x d)
// with G blocks, row = the bytes sent per token and destination (hidden row,
// scale row, ids and weights), d = min(world, top_k) (at least a token's
// destinations, so f errs low).  f >= 1: block 0 owns no token.  Where the
// link rather than the SM limits the sends, the true f is smaller than this;
// the other blocks then carry f / G more than they would need to, a fraction
// of a percent on large grids.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define MOE_EP_SHARES_FN __host__ __device__ __forceinline__
#else
#define MOE_EP_SHARES_FN inline
#endif

namespace moe_ep {
namespace kernels {

// Block 0's share is given in 1/kTokenShareUnit of the other blocks' share.
constexpr int32_t kTokenShareUnit = 256;
// 0.21 ns per pick x 56 GB/s, in bytes per pick (see above).
constexpr double kBlockZeroBytesPerPick = 11.8;

// Block 0's share of the own tokens, in [0, kTokenShareUnit].
MOE_EP_SHARES_FN int32_t block_zero_token_share(int32_t blocks, int32_t top_k, int64_t bytes_per_destination,
                                                int32_t world_size) {
  if (blocks <= 1) return kTokenShareUnit;  // the only block sends everything
  const int64_t destinations = world_size < top_k ? world_size : top_k;
  const double sends = static_cast<double>(bytes_per_destination) * static_cast<double>(destinations);
  const double extra = static_cast<double>(blocks) * top_k * kBlockZeroBytesPerPick;
  if (sends <= 0.0 || extra >= sends) return 0;
  return static_cast<int32_t>(static_cast<double>(kTokenShareUnit) * (1.0 - extra / sends));
}

// The own tokens [*t0, *t1) of block `block` of `blocks`: block 0 takes
// `share0` / kTokenShareUnit of what each other block takes; together the
// ranges cover [0, T) in block order, each token once.
MOE_EP_SHARES_FN void own_token_range(int32_t T, int32_t blocks, int32_t block, int32_t share0, int32_t* t0,
                                      int32_t* t1) {
  const int64_t total = static_cast<int64_t>(blocks - 1) * kTokenShareUnit + share0;
  if (total <= 0) {  // one block that owns nothing cannot happen (share0 is the unit then): every token to it
    *t0 = 0;
    *t1 = block == 0 ? T : 0;
    return;
  }
  const int64_t begin = block == 0 ? 0 : share0 + static_cast<int64_t>(block - 1) * kTokenShareUnit;
  const int64_t end = share0 + static_cast<int64_t>(block) * kTokenShareUnit;
  *t0 = static_cast<int32_t>(T * begin / total);
  *t1 = static_cast<int32_t>(T * end / total);
}

}  // namespace kernels
}  // namespace moe_ep
