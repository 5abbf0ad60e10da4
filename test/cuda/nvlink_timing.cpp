// Times dispatch and combine of the NVLINK_TWO_SIDED backend with CUDA events:
// median over many back-to-back iterations (eager), and over CUDA-graph
// replays (one graph for dispatch, one for combine, replayed alternately).
// Iterations are queued in batches behind a hold kernel and then released, so
// the GPU runs them back to back and the events time the GPU, not the host's
// launch rate.
// Uniform random routing, every rank with the same token count.  Prints the
// slowest rank's medians and the NVLink bytes each phase moves per rank.
//
//   mpirun -np 2 moe_ep_nvlink_timing --tokens 4096 --hidden 7168 --experts 256 --topk 8
#include <cuda_runtime_api.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "hold_kernel.hpp"
#include "mpi_test_bootstrap.hpp"
#include "random_inputs.hpp"
#include "tensor_helpers.hpp"

using namespace moe_ep_test;

namespace {

void ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}
void ok(moe_ep_status_t s, const char* what) {
  if (s != MOE_EP_SUCCESS) throw std::runtime_error(std::string(what) + ": " + moe_ep_last_error());
}

struct Options {
  int tokens = 4096, hidden = 7168, experts = 256, topk = 8, iters = 200, warmup = 20, num_sms = 0;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (k == "--tokens") o.tokens = v;
    else if (k == "--hidden") o.hidden = v;
    else if (k == "--experts") o.experts = v;
    else if (k == "--topk") o.topk = v;
    else if (k == "--iters") o.iters = v;
    else if (k == "--warmup") o.warmup = v;
    else if (k == "--num-sms") o.num_sms = v;
    else throw std::runtime_error("unknown option " + k);
  }
  return o;
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Queues `count` iterations behind a hold kernel on every rank, then releases
// them at once (after a barrier, so that the ranks start together).
class Batches {
 public:
  explicit Batches(cudaStream_t stream) : stream_(stream) {
    ok(cudaHostAlloc(reinterpret_cast<void**>(&release_), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
    ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_device_), release_, 0), "cudaHostGetDevicePointer");
  }
  ~Batches() { cudaFreeHost(release_); }
  template <typename Enqueue>
  void run(int count, int batch, Enqueue enqueue) {
    for (int first = 0; first < count; first += batch) {
      *reinterpret_cast<volatile int*>(release_) = 0;
      MPI_Barrier(MPI_COMM_WORLD);
      ok(moe_ep_test::launch_hold(stream_, release_device_, 500000000LL), "launch_hold");
      for (int i = first; i < first + batch && i < count; ++i) enqueue(i);
      *reinterpret_cast<volatile int*>(release_) = 1;
      ok(cudaStreamSynchronize(stream_), "sync");
    }
  }

 private:
  cudaStream_t stream_;
  int* release_ = nullptr;
  int* release_device_ = nullptr;
};

double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

class Timer {
 public:
  explicit Timer(int n) : start_(n), end_(n) {
    for (int i = 0; i < n; ++i) {
      ok(cudaEventCreate(&start_[i]), "cudaEventCreate");
      ok(cudaEventCreate(&end_[i]), "cudaEventCreate");
    }
  }
  ~Timer() {
    for (auto e : start_) cudaEventDestroy(e);
    for (auto e : end_) cudaEventDestroy(e);
  }
  cudaEvent_t start(int i) { return start_[i]; }
  cudaEvent_t end(int i) { return end_[i]; }
  std::vector<float> microseconds() {
    std::vector<float> us(start_.size());
    for (size_t i = 0; i < us.size(); ++i) {
      float ms = 0;
      ok(cudaEventElapsedTime(&ms, start_[i], end_[i]), "cudaEventElapsedTime");
      us[i] = ms * 1000.0f;
    }
    return us;
  }

 private:
  std::vector<cudaEvent_t> start_, end_;
};

void run(const Options& o) {
  const int rank = mpi_rank(), world = mpi_world_size();
  int devices = 0;
  ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  const int device = (lr ? std::atoi(lr) : rank) % devices;
  ok(cudaSetDevice(device), "cudaSetDevice");

  CaseSpec s;
  s.world_size = world;
  s.num_experts = o.experts;
  s.top_k = o.topk;
  s.hidden_size = o.hidden;
  s.max_tokens_per_rank = o.tokens;
  s.tokens.assign(world, o.tokens);
  s.seed = 2024;
  const RankData d = make_rank_data(s, rank);
  const std::vector<uint8_t> eo = make_expert_output(s, rank, 0);

  // NVLink bytes this rank sends per phase: one row per (token, remote rank it goes to).
  long long remote_rows = 0;
  for (int t = 0; t < d.num_tokens; ++t) {
    for (int r = 0; r < world; ++r) {
      if (r == rank) continue;
      bool goes = false;
      for (int k = 0; k < o.topk; ++k) {
        const int id = d.topk_ids[size_t(t) * o.topk + k];
        goes = goes || (id >= 0 && id / (o.experts / world) == r);
      }
      remote_rows += goes ? 1 : 0;
    }
  }
  const double dispatch_bytes = double(remote_rows) * s.hidden_row_bytes();
  const double combine_bytes = double(remote_rows) * s.combine_row_bytes();

  void *hidden, *ids, *weights, *expert_output;
  ok(cudaMalloc(&hidden, d.hidden.size()), "cudaMalloc");
  ok(cudaMalloc(&ids, d.topk_ids.size() * 4), "cudaMalloc");
  ok(cudaMalloc(&weights, d.topk_weights.size() * 4), "cudaMalloc");
  ok(cudaMalloc(&expert_output, eo.size()), "cudaMalloc");
  ok(cudaMemcpy(hidden, d.hidden.data(), d.hidden.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemcpy(ids, d.topk_ids.data(), d.topk_ids.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemcpy(weights, d.topk_weights.data(), d.topk_weights.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  ok(cudaMemcpy(expert_output, eo.data(), eo.size(), cudaMemcpyHostToDevice), "cudaMemcpy");

  moe_ep_params_t p = s.params();
  moe_ep_config_t c;
  moe_ep_config_init(&c);
  c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  c.device = device;
  c.num_sms = o.num_sms;
  moe_ep_handle_t h = nullptr;
  ok(moe_ep_create(&world_bootstrap(), &p, &c, &h), "moe_ep_create");

  const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device};
  const int64_t T = d.num_tokens;
  TensorRef th(hidden, s.hidden_dtype, {T, o.hidden}, dev);
  TensorRef ti(ids, int32_dtype(), {T, o.topk}, dev);
  TensorRef tw(weights, fp32_dtype(), {T, o.topk}, dev);
  TensorRef te(expert_output, s.combine_dtype, {int64_t(world) * o.tokens, o.hidden}, dev);
  moe_ep_dispatch_args_t a;
  moe_ep_dispatch_args_init(&a);
  a.hidden_states = th.get();
  a.topk_ids = ti.get();
  a.topk_weights = tw.get();
  moe_ep_dispatch_result_t dr;
  moe_ep_dispatch_result_init(&dr);
  moe_ep_combine_result_t cr;
  moe_ep_combine_result_init(&cr);
  cudaStream_t stream;
  ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  for (int i = 0; i < o.warmup; ++i) {
    ok(moe_ep_dispatch(h, &a, &dr, stream), "dispatch");
    ok(moe_ep_combine(h, te.get(), nullptr, &cr, stream), "combine");
  }
  ok(cudaStreamSynchronize(stream), "sync");
  MPI_Barrier(MPI_COMM_WORLD);

  Batches batches(stream);
  constexpr int kBatch = 40;
  Timer eager_d(o.iters), eager_c(o.iters);
  batches.run(o.iters, kBatch, [&](int i) {
    ok(cudaEventRecord(eager_d.start(i), stream), "record");
    ok(moe_ep_dispatch(h, &a, &dr, stream), "dispatch");
    ok(cudaEventRecord(eager_d.end(i), stream), "record");
    ok(cudaEventRecord(eager_c.start(i), stream), "record");
    ok(moe_ep_combine(h, te.get(), nullptr, &cr, stream), "combine");
    ok(cudaEventRecord(eager_c.end(i), stream), "record");
  });
  const double ed = max_over_ranks(median(eager_d.microseconds()));
  const double ec = max_over_ranks(median(eager_c.microseconds()));

  cudaGraph_t gd, gc;
  cudaGraphExec_t xd, xc;
  ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  ok(moe_ep_dispatch(h, &a, &dr, stream), "dispatch (capture)");
  ok(cudaStreamEndCapture(stream, &gd), "capture");
  ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  ok(moe_ep_combine(h, te.get(), nullptr, &cr, stream), "combine (capture)");
  ok(cudaStreamEndCapture(stream, &gc), "capture");
  ok(cudaGraphInstantiate(&xd, gd, 0), "instantiate");
  ok(cudaGraphInstantiate(&xc, gc, 0), "instantiate");
  for (int i = 0; i < o.warmup; ++i) {
    ok(cudaGraphLaunch(xd, stream), "launch");
    ok(cudaGraphLaunch(xc, stream), "launch");
  }
  ok(cudaStreamSynchronize(stream), "sync");
  MPI_Barrier(MPI_COMM_WORLD);
  Timer graph_d(o.iters), graph_c(o.iters);
  batches.run(o.iters, kBatch, [&](int i) {
    ok(cudaEventRecord(graph_d.start(i), stream), "record");
    ok(cudaGraphLaunch(xd, stream), "launch");
    ok(cudaEventRecord(graph_d.end(i), stream), "record");
    ok(cudaEventRecord(graph_c.start(i), stream), "record");
    ok(cudaGraphLaunch(xc, stream), "launch");
    ok(cudaEventRecord(graph_c.end(i), stream), "record");
  });
  const double gdm = max_over_ranks(median(graph_d.microseconds()));
  const double gcm = max_over_ranks(median(graph_c.microseconds()));

  moe_ep_status_t async = MOE_EP_SUCCESS;
  ok(moe_ep_get_async_error(h, &async), "get_async_error");
  if (async != MOE_EP_SUCCESS) throw std::runtime_error(std::string("async error: ") + moe_ep_last_error());

  if (rank == 0) {
    const char* schedule = std::getenv("MOE_EP_COMBINE_SCHEDULE");
    const char* small = std::getenv("MOE_EP_SMALL_BATCH");
    std::printf("tokens/rank %d hidden %d bf16 top-%d of %d, %d ranks, num_sms %d, combine schedule %s, "
                "MOE_EP_SMALL_BATCH %s, %d iterations (median, slowest rank)\n",
                o.tokens, o.hidden, o.topk, o.experts, world, o.num_sms, schedule ? schedule : "default",
                small ? small : "unset", o.iters);
    std::printf("  NVLink bytes per rank and direction: dispatch %.2f MB, combine %.2f MB\n", dispatch_bytes / 1e6,
                combine_bytes / 1e6);
    std::printf("  eager:  dispatch %8.1f us (%6.1f GB/s)   combine %8.1f us (%6.1f GB/s)\n", ed,
                dispatch_bytes / ed / 1e3, ec, combine_bytes / ec / 1e3);
    std::printf("  graph:  dispatch %8.1f us (%6.1f GB/s)   combine %8.1f us (%6.1f GB/s)\n", gdm,
                dispatch_bytes / gdm / 1e3, gcm, combine_bytes / gcm / 1e3);
  }
  cudaGraphExecDestroy(xd);
  cudaGraphExecDestroy(xc);
  cudaGraphDestroy(gd);
  cudaGraphDestroy(gc);
  moe_ep_destroy(&h);
  cudaFree(hidden);
  cudaFree(ids);
  cudaFree(weights);
  cudaFree(expert_output);
  cudaStreamDestroy(stream);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", mpi_rank(), e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
