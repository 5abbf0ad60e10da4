// Does compute-sanitizer's racecheck accept a warp's shared-memory reads as
// released by one lane's mbarrier arrival after a __syncwarp, and what does
// it cost to have every lane arrive instead?  The pattern is the whole-row
// pull combine's (cuda/combine_pull.cu): warp 0 fills row buffers with bulk
// copies and writes a step record, 15 consumer warps read both and release the
// buffer on an "empty" barrier.
//   nvcc -O3 -arch=sm_90 -o probe scripts/gpu/mbarrier_release_probe.cu
//   ./probe MODE STEPS   MODE: warp (one arrival per warp after __syncwarp),
//                        lanes (every consumer thread arrives)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kStages = 12, kRowBytes = 14336, kThreads = 512, kConsumers = kThreads - 32;

__device__ uint32_t sa(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ void init(uint64_t* b, uint32_t n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n));
}
__device__ void arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sa(b)) : "memory");
}
__device__ void wait(uint64_t* b, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done)
                 : "r"(sa(b)), "r"(parity)
                 : "memory");
  }
}
__device__ void copy(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(dst)),
               "l"(src), "r"(bytes), "r"(sa(b))
               : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) probe(const char* rows, float* out, int steps, int every_lane) {
  extern __shared__ __align__(128) char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kStages * kRowBytes);
  uint64_t* empty = full + kStages;
  int* step_of = reinterpret_cast<int*>(empty + kStages);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      init(full + s, 1);
      init(empty + s, every_lane ? kConsumers : kConsumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  if (threadIdx.x < 32) {
    for (int k = 0; k < steps; ++k) {
      const int s = k % kStages, use = k / kStages;
      if (use > 0) wait(empty + s, (use - 1) & 1);
      if (lane == 0) {
        step_of[s] = k;
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        copy(smem + s * kRowBytes, rows + (size_t)(k % 64) * kRowBytes, kRowBytes, full + s);
      }
      __syncwarp();
    }
    return;
  }
  float acc = 0.f;
  const int i = threadIdx.x - 32;
  for (int k = 0; k < steps; ++k) {
    const int s = k % kStages;
    wait(full + s, (k / kStages) & 1);
    acc += static_cast<float>(step_of[s]);
    const uint4* row = reinterpret_cast<const uint4*>(smem + s * kRowBytes);
    for (int v = i; v < kRowBytes / 16; v += kConsumers) acc += __int_as_float(row[v].x & 0x3fffffff);
    if (every_lane) {
      arrive(empty + s);
    } else {
      __syncwarp();
      if (lane == 0) arrive(empty + s);
    }
  }
  out[blockIdx.x * kThreads + threadIdx.x] = acc;
}

int main(int argc, char** argv) {
  const int every_lane = argc > 1 && std::strcmp(argv[1], "lanes") == 0;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 48;
  const int blocks = argc > 3 ? std::atoi(argv[3]) : 16;
  char* rows;
  float* out;
  CHECK(cudaMalloc(&rows, 64 * kRowBytes));
  CHECK(cudaMemset(rows, 1, 64 * kRowBytes));
  CHECK(cudaMalloc(&out, blocks * kThreads * sizeof(float)));
  const size_t smem = kStages * kRowBytes + 2 * kStages * 8 + kStages * 4;
  CHECK(cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  probe<<<blocks, kThreads, smem>>>(rows, out, steps, every_lane);  // warm-up
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  CHECK(cudaEventRecord(a));
  probe<<<blocks, kThreads, smem>>>(rows, out, steps, every_lane);
  CHECK(cudaGetLastError());
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  std::printf("mode %s steps %d blocks %d: %.2f us, %.3f us per step, %.1f GB/s per SM (local rows)\n",
              every_lane ? "lanes" : "warp", steps, blocks, ms * 1e3, ms * 1e3 / steps,
              (double)steps * kRowBytes / (ms * 1e-3) / 1e9);
  return 0;
}
