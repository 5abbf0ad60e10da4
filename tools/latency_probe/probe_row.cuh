// The token row that the row-carrying measurements move into the peer: its
// size (hidden 7168, bf16), the block that stores it, and the contents of
// every 16-byte vector for a given round (so that a receiver can check it).
#pragma once

#include <cuda_runtime.h>

namespace moe_ep_probe {

constexpr unsigned kRowBytes = 14336;             // one token row: hidden 7168, bf16
constexpr unsigned kRowVectors = kRowBytes / 16;  // 896 16-byte stores
constexpr unsigned kRowThreads = 512;             // the block that stores it

// Vector v of the row sent in `round`: different in every round and every vector.
__host__ __device__ inline uint4 row_vector(unsigned round, unsigned v) {
  return make_uint4(round, v, round ^ v, ~round);
}

// The whole block stores the row of `round` into `row` (the peer's memory),
// 16 bytes per store; no barrier.
__device__ __forceinline__ void store_row(uint4* row, unsigned round) {
  for (unsigned v = threadIdx.x; v < kRowVectors; v += blockDim.x) row[v] = row_vector(round, v);
}

}  // namespace moe_ep_probe
