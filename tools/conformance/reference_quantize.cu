// The reference quantize kernel of reference_quantize.hpp.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "dtypes.hpp"
#include "errors.hpp"
#include "reference_quantize.hpp"
#include "wire_oracle.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

namespace {

constexpr int kThreads = 256;  // 8 warps, one block of 128 elements each
constexpr int kMaxBlocks = 4096;
constexpr float kE4m3Max = 448.0f;

__device__ inline float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// The block's scale from its amax over the finite elements (docs/semantics.md).
__host__ __device__ inline float block_scale(float amax, bool ue8m0) {
  if (amax == 0.0f) return 1.0f;
  if (!ue8m0) {
    const float s = amax / kE4m3Max;
    return s == 0.0f ? 0x1p-149f : s;  // underflow: the smallest positive fp32
  }
  // The smallest e >= -127 with 448 * 2^e >= amax: amax = f * 2^x, f in
  // [0.5, 1), and 448 = 0.875 * 2^9, so e = x - 9 when f <= 0.875, else x - 8.
  int x = 0;
  const float f = frexpf(amax, &x);
  const int e = max(f <= 0.875f ? x - 9 : x - 8, -127);
  return ldexpf(1.0f, e);
}

__host__ __device__ inline uint8_t e4m3_code(float x, float scale) {
  if (isnan(x)) return 0x7F;
  const float q = x / scale;  // one fp32 division, round to nearest even
  if (isinf(q)) return q < 0 ? 0xFE : 0x7E;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3));
}

// One warp per (row, block): lane l holds elements 4l..4l+3 of the block.
// kVector: R is a multiple of 4, so those 4 are in the row together and 8-byte
// aligned (loads) and 4-byte aligned (code stores).
template <bool kVector>
__global__ void quantize_kernel(const uint16_t* rows, int64_t num_rows, int row_elems, int blocks, bool ue8m0,
                                uint8_t* codes, float* scales) {
  const int lane = threadIdx.x & 31;
  const int64_t total = num_rows * blocks;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5; w < total; w += warps) {
    const int64_t row = w / blocks;
    const int block = int(w % blocks);
    const int first = block * 128 + lane * 4;
    const uint16_t* src = rows + row * row_elems;
    float x[4];
    bool present[4];
    if (kVector && first < row_elems) {
      const uint2 v = *reinterpret_cast<const uint2*>(src + first);
      x[0] = bf16_bits_to_float(v.x & 0xFFFFu);
      x[1] = bf16_bits_to_float(v.x >> 16);
      x[2] = bf16_bits_to_float(v.y & 0xFFFFu);
      x[3] = bf16_bits_to_float(v.y >> 16);
      for (int j = 0; j < 4; ++j) present[j] = true;
    } else {
      for (int j = 0; j < 4; ++j) {
        present[j] = first + j < row_elems;  // the last block may be short
        x[j] = present[j] ? bf16_bits_to_float(src[first + j]) : 0.0f;
      }
    }
    float amax = 0.0f;
    for (int j = 0; j < 4; ++j) amax = isfinite(x[j]) ? fmaxf(amax, fabsf(x[j])) : amax;
    for (int offset = 16; offset > 0; offset >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    const float scale = block_scale(amax, ue8m0);
    uint8_t* out = codes + row * row_elems;
    if (kVector && first < row_elems) {
      const uint32_t packed = uint32_t(e4m3_code(x[0], scale)) | uint32_t(e4m3_code(x[1], scale)) << 8 |
                              uint32_t(e4m3_code(x[2], scale)) << 16 | uint32_t(e4m3_code(x[3], scale)) << 24;
      *reinterpret_cast<uint32_t*>(out + first) = packed;
    } else {
      for (int j = 0; j < 4; ++j) {
        if (present[j]) out[first + j] = e4m3_code(x[j], scale);
      }
    }
    if (lane == 0) scales[row * blocks + block] = scale;
  }
}

}  // namespace

std::string reference_quantize_refusal(bool on_gpu, const WorkloadSpec& s) {
  if (!on_gpu) return "the reference quantize kernel is a CUDA kernel: a GPU backend is needed";
  if (s.hidden_dtype.code != MOE_EP_DTYPE_BFLOAT || s.hidden_dtype.bits != 16 || s.scale_row_elems != 0) {
    return "the reference quantize kernel takes bf16 rows without scales (--dtype bf16), got " +
           dtype_name(s.hidden_dtype);
  }
  return "";
}

ReferenceQuantize::ReferenceQuantize(const Place& place, const WorkloadSpec& largest)
    : place_(place), rows_(place, uint64_t(largest.max_tokens_per_rank) * largest.hidden_row_bytes()) {}

void ReferenceQuantize::load(const WorkloadSpec& source, int rank, void* stream) {
  source_ = source;
  rank_ = rank;
  num_tokens_ = source.num_tokens(rank);
  rows_.upload(make_hidden(source, rank), stream);
}

cudaError_t ReferenceQuantize::quantize(void* codes, void* scales, cudaStream_t stream) const {
  const int R = source_.row_elems(), blocks = oracle_wire_blocks(R);
  const int64_t warps = int64_t(num_tokens_) * blocks;
  if (warps == 0) return cudaSuccess;
  const int grid = int(std::min<int64_t>((warps + kThreads / 32 - 1) / (kThreads / 32), kMaxBlocks));
  const bool ue8m0 = source_.wire_scale == MOE_EP_WIRE_SCALE_UE8M0;
  const auto* rows = static_cast<const uint16_t*>(rows_.data());
  auto* out = static_cast<uint8_t*>(codes);
  auto* block_scales = static_cast<float*>(scales);
  if (R % 4 == 0) {
    quantize_kernel<true><<<grid, kThreads, 0, stream>>>(rows, num_tokens_, R, blocks, ue8m0, out, block_scales);
  } else {
    quantize_kernel<false><<<grid, kThreads, 0, stream>>>(rows, num_tokens_, R, blocks, ue8m0, out, block_scales);
  }
  return cudaGetLastError();
}

int64_t ReferenceQuantize::check(const void* codes, const void* scales, cudaStream_t stream) const {
  const int R = source_.row_elems(), blocks = oracle_wire_blocks(R);
  const std::vector<uint8_t> got_codes = download(place_, codes, uint64_t(num_tokens_) * R, stream);
  const std::vector<uint8_t> got_scales = download(place_, scales, uint64_t(num_tokens_) * blocks * 4, stream);
  std::vector<uint8_t> want_codes(source_.recv_hidden_row_bytes()), want_scales(source_.recv_scale_row_bytes());
  int64_t wrong = 0;
  for (int t = 0; t < num_tokens_; ++t) {
    fill_received_row(source_, rank_, t, want_codes.data(), want_scales.data());
    for (int i = 0; i < R; ++i) wrong += got_codes[size_t(t) * R + i] != want_codes[i];
    for (int b = 0; b < blocks; ++b) {
      wrong += std::memcmp(&got_scales[(size_t(t) * blocks + b) * 4], &want_scales[size_t(b) * 4], 4) != 0;
    }
  }
  return wrong;
}

}  // namespace moe_ep_tool
