// What only the NCCL backend has, on real GPUs: its timeouts (NCCL's kernels
// wait without a bound; the host aborts the communicator at timeout_ms) and
// its communicator's lifecycle.  The semantics (every case of the NVLink
// suite, compared byte for byte with the HOST backend) run through
// test_nvlink_gpu with MOE_EP_TEST_GPU_BACKEND=nccl (test/nvlink/CMakeLists.txt).
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>

#include "case_skip.hpp"
#include "gpu_case_runner.hpp"
#include "gpu_test_env.hpp"
#include "mpi_test_bootstrap.hpp"
#include "tensor_view.hpp"

using namespace moe_ep_test;
using moe_ep_verify::TensorView;

namespace {

WorkloadSpec small_spec() {
  WorkloadSpec s;
  s.world = mpi_world_size();
  s.num_experts = 64;
  s.top_k = 8;
  s.hidden_size = 1024;
  s.max_tokens_per_rank = 32;
  s.seed = 201;
  return s;
}

// An NCCL handle with one rank's inputs on the device, driven through the C API.
class NcclHandle {
 public:
  NcclHandle(const WorkloadSpec& spec, int timeout_ms) : spec_(spec) {
    moe_ep_params_t p = spec_.params();
    moe_ep_config_t c;
    moe_ep_config_init(&c, sizeof c);
    c.backend = MOE_EP_BACKEND_NCCL;
    c.timeout_ms = timeout_ms;
    c.device = gpu_device();
    const moe_ep_bootstrap_t& b = world_bootstrap();
    if (moe_ep_create(&b, &p, &c, &h_) != MOE_EP_SUCCESS) throw std::runtime_error(moe_ep_last_error());
    const RankInputs d = moe_ep_verify::make_rank_inputs(spec_, b.rank);
    T_ = d.routing.num_tokens;
    cuda_ok(cudaMalloc(&hidden_, d.hidden.size() + 16), "cudaMalloc");
    cuda_ok(cudaMalloc(&ids_, d.routing.topk_ids.size() * 4 + 4), "cudaMalloc");
    eo_bytes_ = size_t(spec_.world) * spec_.tokens_per_rank() * spec_.combine_row_bytes();
    cuda_ok(cudaMalloc(&expert_output_, eo_bytes_), "cudaMalloc");
    cuda_ok(cudaMemcpy(hidden_, d.hidden.data(), d.hidden.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_ok(cudaMemcpy(ids_, d.routing.topk_ids.data(), d.routing.topk_ids.size() * 4, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    cuda_ok(cudaMemset(expert_output_, 0, eo_bytes_), "cudaMemset");
  }
  ~NcclHandle() {
    destroy();
    cudaFree(hidden_);
    cudaFree(ids_);
    cudaFree(expert_output_);
  }
  moe_ep_status_t dispatch() {
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, gpu_device()};
    TensorView th(hidden_, spec_.hidden_dtype, {T_, spec_.row_elems()}, dev);
    TensorView ti(ids_, moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}, {T_, spec_.top_k}, dev);
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a, sizeof a);
    a.hidden_states = th.get();
    a.topk_ids = ti.get();
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    return moe_ep_dispatch(h_, &a, &r, nullptr);
  }
  moe_ep_status_t combine() {
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, gpu_device()};
    TensorView te = moe_ep_verify::expert_output_view(spec_, expert_output_, dev);
    moe_ep_combine_result_t r;
    moe_ep_combine_result_init(&r, sizeof r);
    return moe_ep_combine(h_, te.get(), nullptr, &r, nullptr);
  }
  moe_ep_status_t poll(std::string* message) {
    moe_ep_status_t s = MOE_EP_SUCCESS;
    if (moe_ep_get_async_error(h_, &s) != MOE_EP_SUCCESS) return MOE_EP_ERROR_INTERNAL;
    *message = s ? moe_ep_last_error() : "";
    return s;
  }
  // Seconds destroy took.
  double destroy() {
    const auto start = std::chrono::steady_clock::now();
    moe_ep_destroy(&h_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

 private:
  WorkloadSpec spec_;
  moe_ep_handle_t h_ = nullptr;
  void* hidden_ = nullptr;
  void* ids_ = nullptr;
  void* expert_output_ = nullptr;
  size_t eo_bytes_ = 0;
  int64_t T_ = 0;
};

// The last rank leaves mid-sequence: the others' NCCL transfers never
// complete; get_async_error must return TIMEOUT within about timeout_ms (the
// communicator aborted), later calls must fail at once, and destroy must
// return promptly on every rank.
void check_timeout(bool skip_dispatch) {
  const int missing = mpi_world_size() - 1;
  constexpr int kTimeoutMs = 1000;
  bool ok = true;
  std::string why;
  {
    NcclHandle h(small_spec(), kTimeoutMs);
    std::string m;
    ok = h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS && h.poll(&m) == MOE_EP_SUCCESS;
    why = "first round: " + m;
    if (mpi_rank() != missing) {
      ok = ok && h.dispatch() == MOE_EP_SUCCESS;
      if (!skip_dispatch) ok = ok && h.combine() == MOE_EP_SUCCESS;
      const auto start = std::chrono::steady_clock::now();
      const moe_ep_status_t st = h.poll(&m);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      why = "poll: " + std::string(moe_ep_status_string(st)) + " '" + m + "' after " + std::to_string(waited) + " s";
      ok = ok && st == MOE_EP_ERROR_TIMEOUT && m.find("timeout_ms = 1000") != std::string::npos;
      ok = ok && waited < 10.0 * kTimeoutMs / 1000;
      const moe_ep_status_t again = skip_dispatch ? h.dispatch() : h.dispatch();
      ok = ok && again == MOE_EP_ERROR_TIMEOUT;
    } else if (!skip_dispatch) {
      ok = ok && h.dispatch() == MOE_EP_SUCCESS;  // dispatches, then never combines
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    const double seconds = h.destroy();
    ok = ok && seconds < 5.0;
    if (seconds >= 5.0) why += "; destroy took " + std::to_string(seconds) + " s";
  }
  INFO(why);
  REQUIRE(mpi_all(ok));
}

}  // namespace

TEST_CASE("NCCL: a rank that skips a dispatch or a combine makes the others time out; destroy completes",
          "[gpu][nccl][timeout][multi_rank]") {
  if (mpi_world_size() < 2) {
    skip_case("needs at least two ranks");
    return;
  }
  check_timeout(true);
  check_timeout(false);
  // The group is usable again with fresh handles.
  GpuCaseOptions o;
  o.backend = MOE_EP_BACKEND_NCCL;
  WorkloadSpec s = small_spec();
  s.seed = 202;
  std::string failure;
  try {
    failure = run_gpu_case(s, world_bootstrap(), o);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  INFO(failure);
  REQUIRE(mpi_all(failure.empty()));
}

TEST_CASE("NCCL: 10 create/destroy cycles leave device memory where it was", "[gpu][nccl][lifecycle]") {
  auto free_memory = [] {
    mpi_all(true);
    size_t free_bytes = 0, total = 0;
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return free_bytes;
  };
  { NcclHandle warm(small_spec(), 20000); }  // NCCL's process-wide state is set up once
  const size_t before = free_memory();
  bool ok = true;
  for (int i = 0; i < 10 && ok; ++i) {
    NcclHandle h(small_spec(), 20000);
    std::string m;
    ok = h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS && h.poll(&m) == MOE_EP_SUCCESS;
  }
  const size_t after = free_memory();
  const double lost_mib = (double(before) - double(after)) / (1 << 20);
  INFO("device memory lost over 10 cycles: " << lost_mib << " MiB");
  REQUIRE(mpi_all(ok && lost_mib < 64.0));
}
