// Combine of the NCCL backend, after NCCL brought every peer's expert output
// rows for this rank's tokens into combine_in ([source][tpr] rows): a warp per
// token sums the token's rows over ranks in ascending rank order in fp32 (the
// own rows read straight from expert_output) and stores combine_dtype, with the
// same conversions as the HOST backend, so the output is bitwise equal to it.
// With an FP8 combine wire the rows are wire rows, dequantized as they are summed.
#include <stdint.h>

#include "common/float_convert.cuh"
#include "common/kernel_common.cuh"
#include "nccl_kernels.h"
#include "wire/wire_rows.cuh"
#include "wire/wire_sums.cuh"

namespace moe_ep {
namespace kernels {
namespace {

// Elements per 16-byte vector of Element.
template <typename Element>
constexpr int kPerVector = 16 / sizeof(typename Element::Bits);
// Rows of one token whose vectors are loaded together before they are summed.
constexpr int kRowsAtOnce = 4;

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

template <typename Element, bool kVector>
__global__ void __launch_bounds__(kBlockThreads, 2) reduce_kernel(NcclShape s, NcclBuffers b, NcclCombineLaunch a) {
  using Bits = typename Element::Bits;
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int64_t tpr = a.tokens_per_rank;
  const char* own = static_cast<const char*>(a.expert_output);
  for (int32_t t = a.token_begin + blockIdx.x * kWarpsPerBlock + threadIdx.x / 32; t < a.token_end; t += warps) {
    const TokenDestinations dests =
        TokenDestinations::load(b.token_slots + static_cast<int64_t>(t) * s.world_size, s.world_size, lane);
    // Row pointers of the token's contributions, in ascending rank order (at most 64).
    const char* rows[kMaxWorldSize];
    int n = 0;
    for (uint64_t m = dests.mask; m != 0; m &= m - 1) {
      const int r = lowest_rank(m);
      const int64_t slot = dests.slot(r);
      rows[n++] = r == s.rank ? own + (s.rank * tpr + slot) * s.combine_row_bytes
                              : b.combine_in + (r * tpr + slot) * s.combine_row_bytes;
    }
    char* out = static_cast<char*>(a.output) + static_cast<int64_t>(t) * s.combine_row_bytes;
    if (kVector) {
      constexpr int V = kPerVector<Element>;
      const int64_t vectors = s.hidden_size / V;
      // Two vectors per lane and up to kRowsAtOnce rows loaded before any is
      // summed: enough bytes in flight to run at memory speed.  The sums
      // still add the rows one by one in ascending rank order.
      for (int64_t v = lane; v < vectors; v += 2 * 32) {
        const bool second = v + 32 < vectors;
        // L2 fetches the next step's vectors of every row while this step's
        // loads are in flight: twice the bytes in flight, no more registers.
        for (int i = 0; i < n; ++i) {
          const uint4* row = reinterpret_cast<const uint4*>(rows[i]);
          if (v + 64 < vectors) prefetch_l2(row + v + 64);
          if (v + 96 < vectors) prefetch_l2(row + v + 96);
        }
        float acc[2][V];
#pragma unroll
        for (int j = 0; j < V; ++j) acc[0][j] = acc[1][j] = 0.0f;
        for (int first = 0; first < n; first += kRowsAtOnce) {
          uint4 raw[kRowsAtOnce][2];
#pragma unroll
          for (int i = 0; i < kRowsAtOnce; ++i) {
            if (first + i < n) {
              const uint4* row = reinterpret_cast<const uint4*>(rows[first + i]);
              raw[i][0] = __ldg(row + v);
              raw[i][1] = second ? __ldg(row + v + 32) : make_uint4(0u, 0u, 0u, 0u);
            }
          }
#pragma unroll
          for (int i = 0; i < kRowsAtOnce; ++i) {
            if (first + i < n) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const Bits* e = reinterpret_cast<const Bits*>(&raw[i][h]);
#pragma unroll
                for (int j = 0; j < V; ++j) acc[h][j] += Element::load(e[j]);
              }
            }
          }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (h == 1 && !second) break;
          reinterpret_cast<uint4*>(out)[v + 32 * h] = Element::store_vector(acc[h]);
        }
      }
    } else {
      for (int64_t h = lane; h < s.hidden_size; h += 32) {
        float acc = 0.0f;
        for (int i = 0; i < n; ++i) acc += Element::load(reinterpret_cast<const Bits*>(rows[i])[h]);
        reinterpret_cast<Bits*>(out)[h] = Element::store(acc);
      }
    }
  }
}

// An FP8 combine wire (shape.fp8_combine): every row, the own ones
// included, is a wire row of codes and block scales
// (nccl_combine_wire_row_bytes).  A warp per token; each lane holds 8
// consecutive elements (one block's scale) of every row of the token, each
// dequantized to fp32 exactly as the wire's dequantize kernel does
// (wire::dequantize_code) and added in ascending rank order from 0.0, the
// sum rounded once to combine_dtype: the HOST backend's bits.  kVector: 8-byte
// code loads and 16-byte stores (hidden_size a multiple of 8, output
// 16-byte aligned), else element by element.
constexpr int kWireLaneElems = wire::kLaneElems;

template <typename Element, bool kVector>
__global__ void __launch_bounds__(kBlockThreads, 2)
    reduce_wire_kernel(NcclShape s, NcclBuffers b, NcclCombineLaunch a) {
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * kWarpsPerBlock;
  const int64_t tpr = a.tokens_per_rank;
  const int64_t row_bytes = nccl_combine_wire_row_bytes(s);
  const int64_t scales_at = nccl_combine_wire_scales_offset(s);
  const int32_t H = s.hidden_size;
  const char* own = static_cast<const char*>(a.expert_output);
  for (int32_t t = a.token_begin + blockIdx.x * kWarpsPerBlock + threadIdx.x / 32; t < a.token_end; t += warps) {
    const TokenDestinations dests =
        TokenDestinations::load(b.token_slots + static_cast<int64_t>(t) * s.world_size, s.world_size, lane);
    const char* rows[kMaxWorldSize];
    int n = 0;
    for (uint64_t m = dests.mask; m != 0; m &= m - 1) {
      const int r = lowest_rank(m);
      const int64_t slot = dests.slot(r);
      rows[n++] = (r == s.rank ? own : b.combine_in) + (r * tpr + slot) * row_bytes;
    }
    char* out = static_cast<char*>(a.output) + static_cast<int64_t>(t) * s.combine_row_bytes;
    for (int32_t first = lane * kWireLaneElems; first < H; first += 32 * kWireLaneElems) {
      float acc[kWireLaneElems];
#pragma unroll
      for (int k = 0; k < kWireLaneElems; ++k) acc[k] = 0.0f;
      for (int i0 = 0; i0 < n; i0 += kRowsAtOnce) {
        uint2 codes[kRowsAtOnce];  // 8 codes, one byte each
        float scale[kRowsAtOnce];
#pragma unroll
        for (int i = 0; i < kRowsAtOnce; ++i) {
          if (i0 + i >= n) break;
          const char* row = rows[i0 + i];
          scale[i] = __ldg(reinterpret_cast<const float*>(row + scales_at) + first / kWireBlockElems);
          codes[i] = wire::load_wire_lane(row, first, H, kVector);
        }
#pragma unroll
        for (int i = 0; i < kRowsAtOnce; ++i) {
          if (i0 + i >= n) break;
          wire::add_wire_lane(acc, codes[i], scale[i]);
        }
      }
      wire::store_lane_sums<Element>(out, first, H, kVector, acc);
    }
  }
}

template <typename Element>
cudaError_t launch_for(const NcclShape& s, const NcclBuffers& b, const NcclCombineLaunch& a, cudaStream_t stream) {
  int64_t blocks = (a.token_end - a.token_begin + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (a.max_blocks > 0 && blocks > 2 * a.max_blocks) blocks = 2 * a.max_blocks;  // two blocks fit an SM
  if (blocks < 1) return cudaSuccess;  // no token on this rank
  if (s.fp8_combine) {
    const bool vector = s.hidden_size % kWireLaneElems == 0 && reinterpret_cast<uintptr_t>(a.output) % 16 == 0;
    if (vector) {
      reduce_wire_kernel<Element, true><<<static_cast<int>(blocks), kBlockThreads, 0, stream>>>(s, b, a);
    } else {
      reduce_wire_kernel<Element, false><<<static_cast<int>(blocks), kBlockThreads, 0, stream>>>(s, b, a);
    }
    return cudaGetLastError();
  }
  // 16-byte vectors when every row of every source is 16-byte aligned.
  const uintptr_t bases = reinterpret_cast<uintptr_t>(a.expert_output) | reinterpret_cast<uintptr_t>(a.output) |
                          reinterpret_cast<uintptr_t>(b.combine_in);
  const bool vector = s.combine_row_bytes % 16 == 0 && bases % 16 == 0;
  if (vector) {
    reduce_kernel<Element, true><<<static_cast<int>(blocks), kBlockThreads, 0, stream>>>(s, b, a);
  } else {
    reduce_kernel<Element, false><<<static_cast<int>(blocks), kBlockThreads, 0, stream>>>(s, b, a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_nccl_combine_reduce(const NcclShape& shape, const NcclBuffers& buffers,
                                       const NcclCombineLaunch& args, cudaStream_t stream) {
  switch (shape.combine_dtype) {
    case kCombineBf16: return launch_for<Bf16Element>(shape, buffers, args, stream);
    case kCombineFp16: return launch_for<Fp16Element>(shape, buffers, args, stream);
    default: return launch_for<Fp32Element>(shape, buffers, args, stream);
  }
}

}  // namespace kernels
}  // namespace moe_ep
