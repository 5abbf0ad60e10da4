// A one-GPU stand-in for the 2-GPU combine benchmark (device-only, built by
// scripts/gpu/*.sh): two ranks as two threads of one process, both on device
// 0, each handle with its own stream and SM budget, so that their kernels run
// side by side on disjoint SMs of the one GPU.  (Two processes on one GPU are
// time-sliced without MPS, which makes their timings meaningless; two handles
// of one process share one context.)  The "peer" memory is then the same
// GPU's HBM, so this times what the kernels themselves cost, without NVLink:
// a proxy for consumer-bound cases such as the 8-SM pull combine, not a
// replacement for the 2-GPU figures.
//
// DeepSeek shape (hidden 7168 bf16, top-8 of 256 experts, uniform routing),
// zero-copy combine (expert output written into the combine_input view once,
// then passed back), eager calls timed with events around each call on each
// rank; prints the median over the timed iterations of each rank, and the
// host time spent inside moe_ep_dispatch / moe_ep_combine (validation and
// launches: what an eager caller pays on the CPU per call).  NUM_SMS
// must leave room for both ranks' grids at once (a kernel of one rank spins
// until the other's runs): at most half the SMs, never 0 (all).
// PROXY_PUSH=1: without the zero-copy view, so that combine pushes the rows
// from a separate expert_output buffer (the serial push schedules).
//   usage: [PROXY_HIDDEN=H] [PROXY_PUSH=1] pull_proxy_bench TOKENS NUM_SMS [WARMUP] [ITERS]
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "thread_bootstrap.hpp"

namespace {

void cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
void moe(moe_ep_status_t s, const char* what) {
  if (s != MOE_EP_SUCCESS) throw std::runtime_error(std::string(what) + ": " + moe_ep_last_error());
}

moe_ep_tensor_t tensor(void* data, int64_t* shape, int ndim, uint8_t code, uint8_t bits) {
  moe_ep_tensor_t t{};
  t.data = data;
  t.device.device_type = MOE_EP_DEVICE_CUDA;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype.code = code;
  t.dtype.bits = bits;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

constexpr int kTopK = 8, kExperts = 256;
// Hidden size: 7168, or PROXY_HIDDEN (small rows time what is not the rows).
int hidden_size() {
  const char* v = std::getenv("PROXY_HIDDEN");
  return v != nullptr && std::atoi(v) > 0 ? std::atoi(v) : 7168;
}
const int kHidden = hidden_size();
const bool kPush = std::getenv("PROXY_PUSH") != nullptr && std::atoi(std::getenv("PROXY_PUSH")) != 0;

struct Times {
  std::vector<float> dispatch, combine;            // GPU time between events, us
  std::vector<float> host_dispatch, host_combine;  // host time inside the API call, us
};

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Times run_rank(int rank, const moe_ep_bootstrap_t& b, int T, int sms, int warmup, int iters) {
  cuda(cudaSetDevice(0), "cudaSetDevice");
  moe_ep_params_t p;
  moe_ep_params_init(&p);
  p.num_experts = kExperts;
  p.top_k = kTopK;
  p.max_tokens_per_rank = T;
  p.hidden_size = kHidden;
  moe_ep_config_t c;
  moe_ep_config_init(&c);
  c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  c.device = 0;
  c.num_sms = sms;
  c.zero_copy_combine = kPush ? 0 : 1;
  moe_ep_handle_t h = nullptr;
  moe(moe_ep_create(&b, &p, &c, &h), "moe_ep_create");

  std::mt19937 rng(1234 + rank);
  std::vector<uint16_t> hidden(static_cast<size_t>(T) * kHidden);
  for (auto& x : hidden) x = static_cast<uint16_t>(0x3C00 + rng() % 0x0400);  // bf16 values in [2^-7, 2^-6)
  std::vector<int32_t> ids(static_cast<size_t>(T) * kTopK);
  std::vector<float> weights(ids.size(), 0.125f);
  for (int t = 0; t < T; ++t) {
    std::vector<int32_t> experts(kExperts);
    for (int e = 0; e < kExperts; ++e) experts[e] = e;
    std::shuffle(experts.begin(), experts.end(), rng);
    std::copy(experts.begin(), experts.begin() + kTopK, ids.begin() + static_cast<size_t>(t) * kTopK);
  }
  void *d_hidden, *d_ids, *d_weights, *d_out, *d_expert = nullptr;
  cuda(cudaMalloc(&d_hidden, hidden.size() * 2), "cudaMalloc");
  cuda(cudaMalloc(&d_ids, ids.size() * 4), "cudaMalloc");
  cuda(cudaMalloc(&d_weights, weights.size() * 4), "cudaMalloc");
  cuda(cudaMalloc(&d_out, static_cast<size_t>(T) * kHidden * 2), "cudaMalloc");
  if (kPush) cuda(cudaMalloc(&d_expert, 2 * static_cast<size_t>(T) * kHidden * 2), "cudaMalloc");  // 2 ranks
  cuda(cudaMemcpy(d_hidden, hidden.data(), hidden.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda(cudaMemcpy(d_weights, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  int64_t hidden_shape[2] = {T, kHidden}, ids_shape[2] = {T, kTopK}, out_shape[2] = {T, kHidden};
  const moe_ep_tensor_t th = tensor(d_hidden, hidden_shape, 2, MOE_EP_DTYPE_BFLOAT, 16);
  const moe_ep_tensor_t ti = tensor(d_ids, ids_shape, 2, MOE_EP_DTYPE_INT, 32);
  const moe_ep_tensor_t tw = tensor(d_weights, ids_shape, 2, MOE_EP_DTYPE_FLOAT, 32);
  const moe_ep_tensor_t to = tensor(d_out, out_shape, 2, MOE_EP_DTYPE_BFLOAT, 16);
  int64_t expert_shape[2] = {2 * static_cast<int64_t>(T), kHidden};
  const moe_ep_tensor_t te = tensor(d_expert, expert_shape, 2, MOE_EP_DTYPE_BFLOAT, 16);
  moe_ep_dispatch_args_t a;
  moe_ep_dispatch_args_init(&a);
  a.hidden_states = &th;
  a.topk_ids = &ti;
  a.topk_weights = &tw;
  cudaStream_t s;
  cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t e0, e1, e2;
  cuda(cudaEventCreate(&e0), "cudaEventCreate");
  cuda(cudaEventCreate(&e1), "cudaEventCreate");
  cuda(cudaEventCreate(&e2), "cudaEventCreate");
  // Both ranks finish their setup before either launches: a kernel waiting
  // for its peer while the peer's thread is in a call that synchronises the
  // device (cudaFree, say) would wait out the timeout.
  cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  b.barrier(b.ctx);
  Times times;
  for (int i = 0; i < warmup + iters; ++i) {
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r);
    cuda(cudaEventRecord(e0, s), "cudaEventRecord");
    const double d0 = now_us();
    moe(moe_ep_dispatch(h, &a, &r, s), "moe_ep_dispatch");
    const double d1 = now_us();
    cuda(cudaEventRecord(e1, s), "cudaEventRecord");
    if (i == 0) {  // the expert output: the received rows, once (contents do not change the timing)
      cuda(cudaMemcpyAsync(kPush ? d_expert : r.combine_input.data, r.hidden_states.data,
                           static_cast<size_t>(r.hidden_states.shape[0]) * kHidden * 2, cudaMemcpyDeviceToDevice, s),
           "cudaMemcpyAsync");
      cuda(cudaEventRecord(e1, s), "cudaEventRecord");
    }
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr);
    const double c0 = now_us();
    moe(moe_ep_combine(h, kPush ? &te : &r.combine_input, &to, &cr, s), "moe_ep_combine");
    const double c1 = now_us();
    cuda(cudaEventRecord(e2, s), "cudaEventRecord");
    cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    b.barrier(b.ctx);  // the next dispatch starts together on both ranks
    float d = 0, cm = 0;
    cuda(cudaEventElapsedTime(&d, e0, e1), "cudaEventElapsedTime");
    cuda(cudaEventElapsedTime(&cm, e1, e2), "cudaEventElapsedTime");
    if (i >= warmup) {
      times.dispatch.push_back(d * 1000.0f);
      times.combine.push_back(cm * 1000.0f);
      times.host_dispatch.push_back(static_cast<float>(d1 - d0));
      times.host_combine.push_back(static_cast<float>(c1 - c0));
    }
  }
  b.barrier(b.ctx);  // neither rank frees while the other's kernels run
  moe_ep_status_t async = MOE_EP_SUCCESS;
  moe(moe_ep_get_async_error(h, &async), "moe_ep_get_async_error");
  if (async != MOE_EP_SUCCESS) throw std::runtime_error(std::string("async error: ") + moe_ep_last_error());
  moe(moe_ep_destroy(&h), "moe_ep_destroy");
  cudaFree(d_hidden);
  cudaFree(d_ids);
  cudaFree(d_weights);
  cudaFree(d_out);
  cudaFree(d_expert);
  cudaStreamDestroy(s);
  return times;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENS NUM_SMS [WARMUP] [ITERS]\n", argv[0]);
    return 2;
  }
  const int T = std::atoi(argv[1]), sms = std::atoi(argv[2]);
  if (T <= 0 || sms <= 0) {
    std::fprintf(stderr, "TOKENS and NUM_SMS must be positive (both ranks' grids share one GPU)\n");
    return 2;
  }
  const int warmup = argc > 3 ? std::atoi(argv[3]) : 5, iters = argc > 4 ? std::atoi(argv[4]) : 30;
  // Every kernel loaded before any runs: with lazy loading, a rank's first
  // launch may wait for the kernels in flight in the context, among them its
  // peer's, which spins until this rank's kernel runs (seen here: a run that
  // hung until the timeout).  Ranks in separate processes do not share this.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  std::vector<Times> times(2);
  std::vector<std::string> failures(2);
  moe_ep_test::run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    try {
      times[rank] = run_rank(rank, b, T, sms, warmup, iters);
    } catch (const std::exception& e) {
      failures[rank] = e.what();
    }
  });
  for (int r = 0; r < 2; ++r) {
    if (!failures[r].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", r, failures[r].c_str());
      return 1;
    }
  }
  std::printf("proxy tokens %d sms %d: dispatch %.2f / %.2f us, combine %.2f / %.2f us (median of %d, rank 0 / 1)\n", T,
              sms, median(times[0].dispatch), median(times[1].dispatch), median(times[0].combine),
              median(times[1].combine), iters);
  std::printf("host time inside the calls, tokens %d sms %d: dispatch %.2f / %.2f us, combine %.2f / %.2f us\n", T, sms,
              median(times[0].host_dispatch), median(times[1].host_dispatch), median(times[0].host_combine),
              median(times[1].host_combine));
  return 0;
}
