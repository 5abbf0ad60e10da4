#include "blas_gemm.hpp"

#include "errors.hpp"
#include "random_fill.hpp"

#if MOE_EP_TOOL_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

namespace moe_ep_tool {

namespace {

constexpr int kMaxDim = 1 << 17;

void check_shape(const GemmShape& s) {
  for (int d : {s.m, s.n, s.k}) {
    if (d < 1 || d > kMaxDim) {
      fail("--gemm-mnk: each of M, N, K must be in [1, " + std::to_string(kMaxDim) + "], got " + std::to_string(s.m) +
           "," + std::to_string(s.n) + "," + std::to_string(s.k));
    }
  }
}

}  // namespace

#if MOE_EP_TOOL_HAVE_CUBLAS

namespace {

void check_blas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(std::string(call) + " failed: " + cublasGetStatusName(status) + " (" + cublasGetStatusString(status) + ")");
}

#define TOOL_CHECK_BLAS(call) check_blas((call), #call)

void* random_matrix(uint64_t elems, uint64_t seed) {
  void* p = nullptr;
  TOOL_CHECK_CUDA(cudaMalloc(&p, elems * 2));  // bf16; elems <= 2^34 (kMaxDim^2)
  const cudaError_t filled = launch_fill_uniform_bf16(p, elems, seed, nullptr);
  if (filled != cudaSuccess) {
    cudaFree(p);
    check_cuda(filled, "launch_fill_uniform_bf16", __FILE__, __LINE__);
  }
  return p;
}

}  // namespace

bool BlasGemm::available() { return true; }
std::string BlasGemm::unavailable_reason() { return ""; }

BlasGemm::BlasGemm(const GemmShape& shape, int sm_target, uint64_t seed) : shape_(shape) {
  check_shape(shape);
  try {
    cublasHandle_t h = nullptr;
    TOOL_CHECK_BLAS(cublasCreate(&h));
    handle_ = h;
    if (sm_target > 0) TOOL_CHECK_BLAS(cublasSetSmCountTarget(h, sm_target));
    a_ = random_matrix(uint64_t(shape.m) * shape.k, seed);
    b_ = random_matrix(uint64_t(shape.k) * shape.n, seed + 1);
    c_ = random_matrix(uint64_t(shape.m) * shape.n, seed + 2);
    TOOL_CHECK_CUDA(cudaDeviceSynchronize());  // the fills (legacy stream) are done
  } catch (...) {
    release();
    throw;
  }
}

BlasGemm::~BlasGemm() { release(); }

void BlasGemm::release() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
  for (void* p : {a_, b_, c_}) {
    if (p) cudaFree(p);
  }
  handle_ = a_ = b_ = c_ = nullptr;
}

void BlasGemm::run(cudaStream_t stream) {
  const auto h = static_cast<cublasHandle_t>(handle_);
  const float alpha = 1.0f, beta = 0.0f;
  if (stream != stream_) {  // (re)binding a stream may reset cuBLAS's workspace: only when it changes
    TOOL_CHECK_BLAS(cublasSetStream(h, stream));
    stream_ = stream;
  }
  TOOL_CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, shape_.m, shape_.n, shape_.k, &alpha, a_, CUDA_R_16BF,
                               shape_.m, b_, CUDA_R_16BF, shape_.k, &beta, c_, CUDA_R_16BF, shape_.m,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

#else  // built without cuBLAS

bool BlasGemm::available() { return false; }
std::string BlasGemm::unavailable_reason() {
  return "not built: the CUDA toolkit's cuBLAS (CUDA::cublas) was not found when the tool was configured";
}
BlasGemm::BlasGemm(const GemmShape& shape, int, uint64_t) : shape_(shape) {
  check_shape(shape);
  fail("--overlap-gemm: " + unavailable_reason());
}
BlasGemm::~BlasGemm() = default;
void BlasGemm::release() {}
void BlasGemm::run(cudaStream_t) { fail("--overlap-gemm: " + unavailable_reason()); }

#endif

}  // namespace moe_ep_tool
