#include "blas_gemm.hpp"

#include "errors.hpp"
#include "random_fill.hpp"

#if MOE_EP_TOOL_HAVE_CUBLAS
#include <cublas_v2.h>
#include <dlfcn.h>

#include <mutex>
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

// cuBLAS is loaded at run time, on the first GEMM: only --overlap-gemm needs
// it, so the other modes run where it is not installed.  The library of the
// major version the tool was built with: libcublas.so.N on the loader's search
// path, else in the toolkit's library directory of the build.
struct Blas {
  decltype(&::cublasCreate_v2) create;
  decltype(&::cublasDestroy_v2) destroy;
  decltype(&::cublasSetStream_v2) set_stream;
  decltype(&::cublasSetSmCountTarget) set_sm_count_target;
  // cublasGemmEx (C++ also declares an overload taking int64_t sizes).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&::cublasGetStatusName) status_name;
  decltype(&::cublasGetStatusString) status_string;
  // cuBLAS 12.5 and later; NULL before (only the grouped-GEMM expert needs it).
  cublasStatus_t (*gemm_grouped_batched_ex)(cublasHandle_t, const cublasOperation_t[], const cublasOperation_t[],
                                            const int[], const int[], const int[], const void*, const void* const[],
                                            cudaDataType_t, const int[], const void* const[], cudaDataType_t,
                                            const int[], const void*, void* const[], cudaDataType_t, const int[], int,
                                            const int[], cublasComputeType_t) = nullptr;
};

template <typename Fn>
void resolve(void* library, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

// NULL with *why where cuBLAS cannot be loaded.
const Blas* load_blas(std::string* why) {
  static std::once_flag once;
  static Blas blas;
  static const Blas* loaded = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef MOE_EP_TOOL_CUBLAS_DIR
    if (library == nullptr)
      library = dlopen((std::string(MOE_EP_TOOL_CUBLAS_DIR "/") + name).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (library == nullptr) {
      const char* e = dlerror();
      failure = "cuBLAS could not be loaded: dlopen(\"" + name + "\") failed: " + (e ? e : "unknown error") +
                " (put the CUDA toolkit's lib64 on LD_LIBRARY_PATH)";
      return;
    }
    std::string missing;
    resolve(library, "cublasCreate_v2", &blas.create, &missing);
    resolve(library, "cublasDestroy_v2", &blas.destroy, &missing);
    resolve(library, "cublasSetStream_v2", &blas.set_stream, &missing);
    resolve(library, "cublasSetSmCountTarget", &blas.set_sm_count_target, &missing);
    resolve(library, "cublasGemmEx", &blas.gemm_ex, &missing);
    resolve(library, "cublasGetStatusName", &blas.status_name, &missing);
    resolve(library, "cublasGetStatusString", &blas.status_string, &missing);
    if (!missing.empty()) {
      failure = "cuBLAS at \"" + name + "\" lacks " + missing;
      dlclose(library);
      return;
    }
    blas.gemm_grouped_batched_ex =
        reinterpret_cast<decltype(blas.gemm_grouped_batched_ex)>(dlsym(library, "cublasGemmGroupedBatchedEx"));
    loaded = &blas;  // stays loaded for the life of the process
  });
  if (loaded == nullptr && why != nullptr) *why = failure;
  return loaded;
}

const Blas& blas() {
  std::string why;
  const Blas* b = load_blas(&why);
  if (b == nullptr) fail("--overlap-gemm: " + why);
  return *b;
}

void check_blas(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  fail(std::string(call) + " failed: " + blas().status_name(status) + " (" + blas().status_string(status) + ")");
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

bool BlasGemm::available() { return load_blas(nullptr) != nullptr; }
std::string BlasGemm::unavailable_reason() {
  std::string why;
  return load_blas(&why) != nullptr ? "" : why;
}

BlasGemm::BlasGemm(const GemmShape& shape, int sm_target, uint64_t seed) : shape_(shape) {
  check_shape(shape);
  try {
    cublasHandle_t h = nullptr;
    TOOL_CHECK_BLAS(blas().create(&h));
    handle_ = h;
    if (sm_target > 0) TOOL_CHECK_BLAS(blas().set_sm_count_target(h, sm_target));
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
  if (handle_) blas().destroy(static_cast<cublasHandle_t>(handle_));
  for (void* p : {a_, b_, c_}) {
    if (p) cudaFree(p);
  }
  handle_ = a_ = b_ = c_ = nullptr;
}

void BlasGemm::run(cudaStream_t stream) {
  const auto h = static_cast<cublasHandle_t>(handle_);
  const float alpha = 1.0f, beta = 0.0f;
  if (stream != stream_) {  // (re)binding a stream may reset cuBLAS's workspace: only when it changes
    TOOL_CHECK_BLAS(blas().set_stream(h, stream));
    stream_ = stream;
  }
  TOOL_CHECK_BLAS(blas().gemm_ex(h, CUBLAS_OP_N, CUBLAS_OP_N, shape_.m, shape_.n, shape_.k, &alpha, a_, CUDA_R_16BF,
                                 shape_.m, b_, CUDA_R_16BF, shape_.k, &beta, c_, CUDA_R_16BF, shape_.m,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

bool GroupedBlas::available() { return unavailable_reason().empty(); }

std::string GroupedBlas::unavailable_reason() {
  std::string why;
  const Blas* b = load_blas(&why);
  if (b == nullptr) return why;
  if (b->gemm_grouped_batched_ex == nullptr) {
    return "the loaded cuBLAS (libcublas.so." + std::to_string(CUBLAS_VER_MAJOR) +
           ") lacks cublasGemmGroupedBatchedEx (cuBLAS 12.5 or later is needed)";
  }
  return "";
}

GroupedBlas::GroupedBlas(int sm_target) {
  const std::string why = unavailable_reason();
  if (!why.empty()) fail("--expert-gemm grouped: " + why);
  cublasHandle_t h = nullptr;
  TOOL_CHECK_BLAS(blas().create(&h));
  handle_ = h;
  if (sm_target > 0) TOOL_CHECK_BLAS(blas().set_sm_count_target(h, sm_target));
}

GroupedBlas::~GroupedBlas() {
  if (handle_) blas().destroy(static_cast<cublasHandle_t>(handle_));
}

void GroupedBlas::bind(cudaStream_t stream) {
  if (stream == stream_) return;
  TOOL_CHECK_BLAS(blas().set_stream(static_cast<cublasHandle_t>(handle_), stream));
  stream_ = stream;
}

void GroupedBlas::run(int m, int k, const std::vector<int>& n, const void* const* a, int lda, const void* const* b,
                      int ldb, void* const* c, int ldc, cudaStream_t stream) {
  const auto h = static_cast<cublasHandle_t>(handle_);
  bind(stream);
  const size_t g = n.size();
  if (g == 0) return;
  m_.assign(g, m);
  k_.assign(g, k);
  lda_.assign(g, lda);
  ldb_.assign(g, ldb);
  ldc_.assign(g, ldc);
  group_size_.assign(g, 1);  // one GEMM per group: each has its own n
  alpha_.assign(g, 1.0f);
  beta_.assign(g, 0.0f);
  static_assert(sizeof(cublasOperation_t) == sizeof(int), "cublasOperation_t is held as int");
  trans_.assign(g, int(CUBLAS_OP_N));
  const auto* op = reinterpret_cast<const cublasOperation_t*>(trans_.data());
  TOOL_CHECK_BLAS(blas().gemm_grouped_batched_ex(
      h, op, op, m_.data(), n.data(), k_.data(), alpha_.data(), a, CUDA_R_16BF, lda_.data(), b, CUDA_R_16BF,
      ldb_.data(), beta_.data(), c, CUDA_R_16BF, ldc_.data(), int(g), group_size_.data(), CUBLAS_COMPUTE_32F));
}

#else  // built without cuBLAS

bool GroupedBlas::available() { return false; }
std::string GroupedBlas::unavailable_reason() { return BlasGemm::unavailable_reason(); }
GroupedBlas::GroupedBlas(int) { fail("--expert-gemm grouped: " + unavailable_reason()); }
GroupedBlas::~GroupedBlas() = default;
void GroupedBlas::bind(cudaStream_t) { fail("--expert-gemm grouped: " + unavailable_reason()); }
void GroupedBlas::run(int, int, const std::vector<int>&, const void* const*, int, const void* const*, int, void* const*,
                      int, cudaStream_t) {
  fail("--expert-gemm grouped: " + unavailable_reason());
}

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
