// One bf16 GEMM through the CUDA toolkit's cuBLAS, the compute that the
// overlap measurement (gemm_overlap.hpp) runs beside dispatch and combine:
// C[M, N] = A[M, K] * B[K, N], column-major, fp32 accumulation, on random
// operands it owns.  cuBLAS is optional and loaded at run time (dlopen): a
// tool configured without its header, or run where it does not load, has
// this class, but constructing one fails with the reason (available() says
// so beforehand).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moe_ep_tool {

struct GemmShape {
  int m = 0, n = 0, k = 0;
  double flops() const { return 2.0 * m * n * k; }
};

class BlasGemm {
 public:
  static bool available();
  static std::string unavailable_reason();  // "" when available

  // sm_target: the SMs cuBLAS is asked to use (cublasSetSmCountTarget), 0 = all.
  BlasGemm(const GemmShape& shape, int sm_target, uint64_t seed);
  ~BlasGemm();
  BlasGemm(const BlasGemm&) = delete;
  BlasGemm& operator=(const BlasGemm&) = delete;

  void run(cudaStream_t stream);  // queues one GEMM
  const GemmShape& shape() const { return shape_; }

 private:
  void release();

  GemmShape shape_;
  void* handle_ = nullptr;  // cublasHandle_t
  void *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the stream the handle is bound to (cuBLAS's default: the legacy stream)
};

// One cublasGemmGroupedBatchedEx call (cuBLAS 12.5 and later), the grouped
// GEMM of the grouped-GEMM stand-in expert (grouped_expert.hpp): group g is
// one GEMM C_g[m, n_g] = A_g[m, k] * B_g[k, n_g], column-major, bf16 operands,
// fp32 accumulation.  The pointer arrays are device memory (so that a kernel
// can fill them from device offsets); the sizes are host values, as cuBLAS
// takes them.  Loaded like BlasGemm; available() is false, with the reason,
// where the loaded cuBLAS lacks the entry point.
class GroupedBlas {
 public:
  static bool available();
  static std::string unavailable_reason();  // "" when available

  explicit GroupedBlas(int sm_target);  // sm_target as BlasGemm's
  ~GroupedBlas();
  GroupedBlas(const GroupedBlas&) = delete;
  GroupedBlas& operator=(const GroupedBlas&) = delete;

  // Binds the handle to `stream` (run does when the stream changes): call it
  // before a capture, so that the capture records no rebinding.
  void bind(cudaStream_t stream);
  // n.size() groups, each n[g] >= 1; a, b, c: device arrays of n.size() pointers.
  void run(int m, int k, const std::vector<int>& n, const void* const* a, int lda, const void* const* b, int ldb,
           void* const* c, int ldc, cudaStream_t stream);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
  cudaStream_t stream_ = nullptr;
  std::vector<int> m_, k_, lda_, ldb_, ldc_, group_size_;
  std::vector<float> alpha_, beta_;
  std::vector<int> trans_;  // cublasOperation_t, CUBLAS_OP_N
};

}  // namespace moe_ep_tool
