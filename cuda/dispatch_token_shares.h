// How a dispatch grid shares the rank's own tokens between its blocks
// (dispatch_kernel.cu): plain C++ shared by the kernels and a host test
// (test/nvlink/test_dispatch_token_shares.cpp).  The general kernel splits
// them evenly over its logical blocks; the small-batch kernel gives block 0,
// which sends the counts before its rows, none when there are other blocks.
// (v24-v25 gave the general kernel's block 0 a smaller share for the
// histogram of every pick it counted; since the look-back, v27, every block
// counts its own picks.)
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
