// Exhaustive check of combine's vector stores (cuda/common/float_convert.cuh): the
// two-at-once hardware conversions must give the same bits as the scalar
// ones (which equal the host's, src/dtype.cpp) for every one of the 2^32
// float inputs, in either half of the pair, NaNs included.  And the packed
// sums of two partials (Element::sum_two) must give, for every pair of bf16
// and of fp16 inputs (2^32 each, both orders), the bits of combine's fp32
// path (0 + a + b, rounded once), with NaN results flagged exactly.  One
// GPU, no MPI; exits 77 (skipped) without a GPU.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "common/float_convert.cuh"

namespace {

using moe_ep::kernels::float_to_bf16_bits;
using moe_ep::kernels::float_to_fp16_bits;
using moe_ep::kernels::floats_to_bf16x2_bits;
using moe_ep::kernels::floats_to_fp16x2_bits;

struct Mismatches {
  unsigned long long count;
  uint32_t first_input;
  uint32_t first_kind;  // 1 bf16 low, 2 bf16 high, 3 fp16 low, 4 fp16 high, 5 bf16 x8, 6 fp16 x8,
                        // 7 bf16 sum of two, 8 fp16 sum of two
};

__device__ void report(Mismatches* m, uint32_t input, uint32_t kind) {
  if (atomicAdd(&m->count, 1ull) == 0) {
    m->first_input = input;
    m->first_kind = kind;
  }
}

// Input u in both halves; the other half holds a scrambled pattern (any
// value, NaNs too), so that a pair with one NaN is covered as well.
__global__ void check_all(uint64_t begin, uint64_t end, Mismatches* m) {
  for (uint64_t i = begin + blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < end;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float f = __uint_as_float(u);
    const float other = __uint_as_float(u * 2654435761u + 0x9E3779B9u);
    const uint32_t b = float_to_bf16_bits(f), bo = float_to_bf16_bits(other);
    const uint32_t h = float_to_fp16_bits(f), ho = float_to_fp16_bits(other);
    if (floats_to_bf16x2_bits(f, other) != (b | bo << 16)) report(m, u, 1);
    if (floats_to_bf16x2_bits(other, f) != (bo | b << 16)) report(m, u, 2);
    if (floats_to_fp16x2_bits(f, other) != (h | ho << 16)) report(m, u, 3);
    if (floats_to_fp16x2_bits(other, f) != (ho | h << 16)) report(m, u, 4);
    // Eight at once (combine's store_vector): u at a position that moves
    // with u, next to ordinary values and to the scrambled one, against the
    // pairs above.
    float v[8] = {1.0f, -2.5f, 3.0e-39f, 65504.0f, -0.0f, 7.0f, other, 0.1f};
    v[u % 8] = f;
    const uint4 bx = moe_ep::kernels::Bf16Element::store_vector(v);
    const uint4 hx = moe_ep::kernels::Fp16Element::store_vector(v);
    const uint32_t bw[4] = {bx.x, bx.y, bx.z, bx.w}, hw[4] = {hx.x, hx.y, hx.z, hx.w};
    for (int k = 0; k < 4; ++k) {
      if (bw[k] != floats_to_bf16x2_bits(v[2 * k], v[2 * k + 1])) report(m, u, 5);
      if (hw[k] != floats_to_fp16x2_bits(v[2 * k], v[2 * k + 1])) report(m, u, 6);
    }
  }
}

// One half of a sum_two result against the fp32 path: equal bits where the
// half is not flagged, and flagged exactly where the fp32 result is a NaN.
template <typename Element>
__device__ bool half_matches(uint32_t x, uint32_t y, uint32_t sum, uint32_t nan, int half) {
  const float reference = 0.0f + Element::load(static_cast<uint16_t>(x)) + Element::load(static_cast<uint16_t>(y));
  const bool flagged = ((nan >> (16 * half)) & 0x8000u) != 0;
  if (flagged != (reference != reference)) return false;
  return flagged || ((sum >> (16 * half)) & 0xFFFFu) == Element::store(reference);
}

// Input i is the pair (a, b) = (low, high 16 bits): word A holds (a, b),
// word B (b, a), so that both orders are summed; the other words of the
// vectors hold +0 (0 + 0 + 0: never flagged, which the test also checks).
template <typename Element>
__device__ void check_sum_two(uint32_t i, uint32_t kind, Mismatches* m) {
  const uint32_t a = i & 0xFFFFu, b = i >> 16;
  const uint32_t A = a | b << 16, B = b | a << 16;
  uint32_t nan = 0;
  const uint4 r = Element::sum_two(make_uint4(A, 0u, 0u, 0u), make_uint4(B, 0u, 0u, 0u), nan);
  const bool good = half_matches<Element>(a, b, r.x, nan, 0) && half_matches<Element>(b, a, r.x, nan, 1) && r.y == 0u &&
                    r.z == 0u && r.w == 0u;
  if (!good) report(m, i, kind);
}

__global__ void check_sums(uint64_t begin, uint64_t end, Mismatches* m) {
  for (uint64_t i = begin + blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < end;
       i += uint64_t{gridDim.x} * blockDim.x) {
    check_sum_two<moe_ep::kernels::Bf16Element>(static_cast<uint32_t>(i), 7, m);
    check_sum_two<moe_ep::kernels::Fp16Element>(static_cast<uint32_t>(i), 8, m);
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("skipped: no GPU\n");
    return 77;
  }
  Mismatches* m = nullptr;
  if (!ok(cudaMallocManaged(&m, sizeof(Mismatches)), "cudaMallocManaged")) return 1;
  *m = Mismatches{};
  const uint64_t total = uint64_t{1} << 32, step = uint64_t{1} << 28;
  for (uint64_t begin = 0; begin < total; begin += step) {
    check_all<<<1024, 256>>>(begin, begin + step, m);
    if (!ok(cudaGetLastError(), "launching check_all")) return 1;
    check_sums<<<1024, 256>>>(begin, begin + step, m);
    if (!ok(cudaGetLastError(), "launching check_sums")) return 1;
  }
  if (!ok(cudaDeviceSynchronize(), "check_all, check_sums")) return 1;
  printf("%llu mismatches over 2^32 inputs x 6 conversions and 2^32 pairs x 2 sums", m->count);
  if (m->count != 0) printf(" (first: input 0x%08x, kind %u)", m->first_input, m->first_kind);
  printf("\n");
  const bool pass = m->count == 0;
  cudaFree(m);
  return pass ? 0 : 1;
}
