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

}  // namespace moe_ep_tool
