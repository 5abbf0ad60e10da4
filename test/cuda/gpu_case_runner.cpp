#include "gpu_case_runner.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "gpu_test_env.hpp"
#include "tensor_helpers.hpp"

namespace moe_ep_test {

namespace {

constexpr uint8_t kPoison = 0xCD;

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) cuda_ok(cudaMalloc(&p_, bytes_), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  void upload(const void* src, size_t bytes) {
    if (bytes) cuda_ok(cudaMemcpy(p_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

uint64_t elements(const moe_ep_tensor_t& t) {
  uint64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<uint64_t>(t.shape[i]);
  return n;
}

uint64_t tensor_bytes(const moe_ep_tensor_t& t) {
  if (t.data == nullptr) return 0;
  return (elements(t) * t.dtype.bits * t.dtype.lanes + 7) / 8;
}

const char* tensor_data(const moe_ep_tensor_t& t) { return static_cast<const char*>(t.data) + t.byte_offset; }

std::vector<uint8_t> download(const moe_ep_tensor_t& t) {
  std::vector<uint8_t> out(tensor_bytes(t));
  if (!out.empty()) cuda_ok(cudaMemcpy(out.data(), tensor_data(t), out.size(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

std::vector<uint8_t> host_bytes(const moe_ep_tensor_t& t) {
  const auto* p = reinterpret_cast<const uint8_t*>(tensor_data(t));
  return t.data ? std::vector<uint8_t>(p, p + tensor_bytes(t)) : std::vector<uint8_t>{};
}

void poison(const moe_ep_tensor_t& t) {
  if (t.data) cuda_ok(cudaMemset(const_cast<char*>(tensor_data(t)), kPoison, tensor_bytes(t)), "cudaMemset(poison)");
}

template <typename T>
std::vector<T> as(const std::vector<uint8_t>& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// Host copies of a dispatch result, from device (GPU) or host (HOST) memory.
ReceivedCopy copy_result(const moe_ep_dispatch_result_t& r, bool on_device) {
  auto get = [&](const moe_ep_tensor_t& t) { return on_device ? download(t) : host_bytes(t); };
  ReceivedCopy c;
  c.recv_counts = as<int32_t>(get(r.recv_counts));
  c.topk_ids = as<int32_t>(get(r.topk_ids));
  c.local_expert_counts = as<int32_t>(get(r.local_expert_counts));
  c.eplb_gathered = as<int32_t>(get(r.eplb_gathered_stats));
  c.has_weights = r.topk_weights.data != nullptr;
  c.topk_weights = as<float>(get(r.topk_weights));
  c.hidden = get(r.hidden_states);
  c.scales = get(r.hidden_states_scale);
  return c;
}

// GPU result vs HOST result of the same dispatch: every field, every row of
// ids and weights, payload bytes on the rows that carry a token.
std::string compare_with_host(const CaseSpec& spec, const ReceivedCopy& gpu, const ReceivedCopy& host) {
  std::ostringstream os;
  int notes = 0;
  auto note = [&](const std::string& s) {
    if (notes++ < 8) os << s << "\n";
  };
  const int tpr = spec.tokens_per_rank(), K = spec.top_k;
  if (gpu.recv_counts != host.recv_counts) note("recv_counts differ");
  if (gpu.local_expert_counts != host.local_expert_counts) note("local_expert_counts differ");
  if (gpu.eplb_gathered != host.eplb_gathered) note("eplb_gathered_stats differ");
  if (gpu.has_weights != host.has_weights) note("topk_weights present on one side only");
  if (gpu.topk_ids.size() != host.topk_ids.size()) note("topk_ids sizes differ");
  for (size_t i = 0; i < gpu.topk_ids.size() && i < host.topk_ids.size(); ++i) {
    if (gpu.topk_ids[i] != host.topk_ids[i]) {
      note("topk_ids[row " + std::to_string(i / K) + ", pick " + std::to_string(i % K) + "]: host " +
           std::to_string(host.topk_ids[i]) + ", gpu " + std::to_string(gpu.topk_ids[i]));
    }
  }
  if (gpu.topk_weights.size() != host.topk_weights.size() ||
      (!gpu.topk_weights.empty() &&
       std::memcmp(gpu.topk_weights.data(), host.topk_weights.data(), gpu.topk_weights.size() * sizeof(float)) != 0)) {
    note("topk_weights differ");
  }
  const uint64_t hb = spec.hidden_row_bytes(), sb = spec.scale_row_bytes();
  if (gpu.hidden.size() != host.hidden.size() || gpu.scales.size() != host.scales.size()) note("payload sizes differ");
  for (int s = 0; s < spec.world_size && gpu.hidden.size() == host.hidden.size(); ++s) {
    const int rows = s < static_cast<int>(host.recv_counts.size()) ? host.recv_counts[s] : 0;
    for (int j = 0; j < rows; ++j) {
      const size_t row = size_t(s) * tpr + j;
      if (std::memcmp(&gpu.hidden[row * hb], &host.hidden[row * hb], hb) != 0) {
        note("hidden row " + std::to_string(row) + " differs");
      }
      if (sb && gpu.scales.size() == host.scales.size() &&
          std::memcmp(&gpu.scales[row * sb], &host.scales[row * sb], sb) != 0) {
        note("scale row " + std::to_string(row) + " differs");
      }
    }
  }
  if (notes > 8) os << "... " << notes - 8 << " more\n";
  return os.str();
}

class Handle {
 public:
  Handle(const moe_ep_bootstrap_t& b, const CaseSpec& spec, int32_t backend, const GpuCaseOptions& o, int device) {
    moe_ep_params_t params = spec.params();
    moe_ep_config_t config;
    moe_ep_config_init(&config);
    config.backend = backend;
    config.timeout_ms = o.timeout_ms;
    config.num_sms = o.num_sms;
    config.device = backend == MOE_EP_BACKEND_HOST ? -1 : device;
    if (moe_ep_create(&b, &params, &config, &h_) != MOE_EP_SUCCESS) {
      throw std::runtime_error(std::string("moe_ep_create: ") + moe_ep_last_error());
    }
  }
  ~Handle() { moe_ep_destroy(&h_); }
  moe_ep_handle_t get() const { return h_; }

 private:
  moe_ep_handle_t h_ = nullptr;
};

void expect_ok(moe_ep_status_t s, const char* what) {
  if (s != MOE_EP_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error());
  }
}

// The caller's tensors of one rank, on the GPU (fixed addresses, so that a
// captured graph sees each round's new contents) or on the host.
struct Inputs {
  std::unique_ptr<DeviceBuffer> hidden, ids, weights, scales, eplb, expert_output, output;
  std::unique_ptr<TensorRef> t_hidden, t_ids, t_weights, t_scales, t_eplb, t_expert_output, t_output;
  moe_ep_dispatch_args_t args{};
};

void describe(Inputs& in, const CaseSpec& spec, const RankData& d, const std::vector<uint8_t>& expert_output,
              const void* hidden, const void* ids, const void* weights, const void* scales, const void* eplb,
              const void* eo, void* output, moe_ep_device_t dev) {
  const int64_t T = d.num_tokens;
  in.t_hidden = std::make_unique<TensorRef>(hidden, spec.hidden_dtype, std::vector<int64_t>{T, spec.row_elems()}, dev);
  in.t_ids = std::make_unique<TensorRef>(ids, int32_dtype(), std::vector<int64_t>{T, spec.top_k}, dev);
  in.t_weights = std::make_unique<TensorRef>(weights, fp32_dtype(), std::vector<int64_t>{T, spec.top_k}, dev);
  in.t_scales = std::make_unique<TensorRef>(scales, spec.scale_dtype, std::vector<int64_t>{T, spec.scale_row_elems}, dev);
  in.t_eplb = std::make_unique<TensorRef>(eplb, int32_dtype(), std::vector<int64_t>{spec.num_experts}, dev);
  const int64_t P = int64_t(spec.world_size) * spec.tokens_per_rank();
  in.t_expert_output = std::make_unique<TensorRef>(eo, spec.combine_dtype, std::vector<int64_t>{P, spec.hidden_size}, dev);
  in.t_output = std::make_unique<TensorRef>(output, spec.combine_dtype, std::vector<int64_t>{T, spec.hidden_size}, dev);
  (void)expert_output;
  moe_ep_dispatch_args_init(&in.args);
  in.args.hidden_states = in.t_hidden->get();
  in.args.topk_ids = in.t_ids->get();
  in.args.topk_weights = spec.with_weights ? in.t_weights->get() : nullptr;
  in.args.hidden_states_scale = spec.scale_row_elems ? in.t_scales->get() : nullptr;
  in.args.runtime_max_tokens_per_rank = spec.runtime_max_tokens_per_rank;
  in.args.eplb_local_stats = spec.pass_eplb_local ? in.t_eplb->get() : nullptr;
}

void allocate_device_inputs(Inputs& in, const CaseSpec& spec) {
  const size_t M = spec.max_tokens_per_rank, K = spec.top_k;
  in.hidden = std::make_unique<DeviceBuffer>(M * spec.hidden_row_bytes() + 16);
  in.ids = std::make_unique<DeviceBuffer>(M * K * 4);
  in.weights = std::make_unique<DeviceBuffer>(M * K * 4);
  in.scales = std::make_unique<DeviceBuffer>(M * spec.scale_row_bytes() + 16);
  in.eplb = std::make_unique<DeviceBuffer>(size_t(spec.num_experts) * 4);
  in.expert_output = std::make_unique<DeviceBuffer>(size_t(spec.world_size) * M * spec.combine_row_bytes());
  in.output = std::make_unique<DeviceBuffer>(M * spec.combine_row_bytes());
}

void upload(Inputs& in, const CaseSpec& spec, const RankData& d, const std::vector<uint8_t>& eo) {
  in.hidden->upload(d.hidden.data(), d.hidden.size());
  in.ids->upload(d.topk_ids.data(), d.topk_ids.size() * 4);
  in.weights->upload(d.topk_weights.data(), d.topk_weights.size() * 4);
  in.scales->upload(d.scales.data(), d.scales.size());
  if (spec.pass_eplb_local) in.eplb->upload(d.eplb_local.data(), d.eplb_local.size() * 4);
  in.expert_output->upload(eo.data(), eo.size());
}

void poison_results(const moe_ep_dispatch_result_t& r, const moe_ep_tensor_t& output) {
  for (const moe_ep_tensor_t* t : {&r.hidden_states, &r.topk_ids, &r.topk_weights, &r.hidden_states_scale,
                                   &r.recv_counts, &r.local_expert_counts, &r.eplb_gathered_stats, &output}) {
    poison(*t);
  }
}

}  // namespace

int32_t gpu_backend_under_test() {
  const char* v = std::getenv("MOE_EP_TEST_GPU_BACKEND");
  return v != nullptr && std::strcmp(v, "nccl") == 0 ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_NVLINK_TWO_SIDED;
}

std::string run_gpu_case(const CaseSpec& spec_in, const moe_ep_bootstrap_t& b, const GpuCaseOptions& o) {
  const int rank = b.rank;
  const int device = o.device >= 0 ? o.device : gpu_device();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  CaseSpec spec = spec_in;
  if (o.graph && spec.tokens.empty()) {  // a graph has fixed shapes: fix every rank's T
    for (int r = 0; r < spec.world_size; ++r) spec.tokens.push_back(make_rank_data(spec, r).num_tokens);
  }
  Handle nv(b, spec, o.backend, o, device);
  Handle host(b, spec, MOE_EP_BACKEND_HOST, o, device);
  const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device};
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<cudaStream_t, void (*)(cudaStream_t*)> stream_owner(&stream, [](cudaStream_t* s) {
    cudaStreamDestroy(*s);
  });

  Inputs gpu;
  allocate_device_inputs(gpu, spec);
  moe_ep_dispatch_result_t gpu_result;
  moe_ep_dispatch_result_init(&gpu_result);
  moe_ep_combine_result_t gpu_combined;
  moe_ep_combine_result_init(&gpu_combined);
  cudaGraphExec_t graph_exec = nullptr;
  bool have_results = false;
  std::ostringstream failures;

  for (int round = 0; round < o.rounds; ++round) {
    CaseSpec round_spec = spec;
    round_spec.seed = spec.seed + 7919ull * round;
    RankData data = make_rank_data(round_spec, rank);
    if (o.edit_inputs) o.edit_inputs(rank, data);
    const std::vector<uint8_t> eo = make_expert_output(round_spec, rank, round);
    upload(gpu, spec, data, eo);
    describe(gpu, spec, data, eo, gpu.hidden->get(), gpu.ids->get(), gpu.weights->get(), gpu.scales->get(),
             gpu.eplb->get(), gpu.expert_output->get(), gpu.output->get(), dev);
    if (o.caller_output) {
      cuda_ok(cudaMemset(gpu.output->get(), kPoison, size_t(data.num_tokens) * spec.combine_row_bytes()), "poison");
    }
    if (have_results) poison_results(gpu_result, gpu_combined.output);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    expect_ok(b.barrier(b.ctx) == 0 ? MOE_EP_SUCCESS : MOE_EP_ERROR_BOOTSTRAP, "barrier");  // nobody dispatches into poison

    if (o.graph && graph_exec == nullptr) {
      cudaGraph_t graph = nullptr;
      cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      expect_ok(moe_ep_dispatch(nv.get(), &gpu.args, &gpu_result, stream), "moe_ep_dispatch (capture)");
      expect_ok(moe_ep_combine(nv.get(), gpu.t_expert_output->get(), o.caller_output ? gpu.t_output->get() : nullptr,
                               &gpu_combined, stream),
                "moe_ep_combine (capture)");
      cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      cuda_ok(cudaGraphInstantiate(&graph_exec, graph, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(graph);
    }
    if (o.graph) {
      cuda_ok(cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch");
    } else {
      expect_ok(moe_ep_dispatch(nv.get(), &gpu.args, &gpu_result, stream), "moe_ep_dispatch");
      if (o.between_dispatch_and_combine) o.between_dispatch_and_combine();
      expect_ok(moe_ep_combine(nv.get(), gpu.t_expert_output->get(), o.caller_output ? gpu.t_output->get() : nullptr,
                               &gpu_combined, stream),
                "moe_ep_combine");
    }
    have_results = true;

    // The same round through the HOST backend, on host copies of the inputs.
    Inputs cpu;
    describe(cpu, spec, data, eo, data.hidden.data(), data.topk_ids.data(), data.topk_weights.data(),
             data.scales.data(), data.eplb_local.data(), eo.data(), nullptr, moe_ep_device_t{MOE_EP_DEVICE_CPU, 0});
    moe_ep_dispatch_result_t host_result;
    moe_ep_dispatch_result_init(&host_result);
    expect_ok(moe_ep_dispatch(host.get(), &cpu.args, &host_result, nullptr), "HOST dispatch");
    const ReceivedCopy host_copy = copy_result(host_result, false);
    moe_ep_combine_result_t host_combined;
    moe_ep_combine_result_init(&host_combined);
    expect_ok(moe_ep_combine(host.get(), cpu.t_expert_output->get(), nullptr, &host_combined, nullptr), "HOST combine");
    const std::vector<uint8_t> host_out = host_bytes(host_combined.output);

    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const ReceivedCopy gpu_copy = copy_result(gpu_result, true);
    const std::vector<uint8_t> gpu_out = download(gpu_combined.output);
    std::string diff = compare_with_host(spec, gpu_copy, host_copy);
    if (gpu_result.tokens_per_rank != host_result.tokens_per_rank) diff += "tokens_per_rank differs\n";
    if (gpu_out != host_out) {
      size_t first = 0;
      while (first < gpu_out.size() && first < host_out.size() && gpu_out[first] == host_out[first]) ++first;
      diff += "combine output differs (" + std::to_string(gpu_out.size()) + " vs " + std::to_string(host_out.size()) +
              " bytes, first at byte " + std::to_string(first) + ")\n";
    }
    // Device-side errors: the GPU must report exactly what the HOST backend reports.
    moe_ep_status_t gpu_async = MOE_EP_SUCCESS, host_async = MOE_EP_SUCCESS;
    expect_ok(moe_ep_get_async_error(nv.get(), &gpu_async), "moe_ep_get_async_error (gpu)");
    const std::string gpu_message = gpu_async ? moe_ep_last_error() : "";
    expect_ok(moe_ep_get_async_error(host.get(), &host_async), "moe_ep_get_async_error (host)");
    const std::string host_message = host_async ? moe_ep_last_error() : "";
    if (gpu_async != host_async || gpu_message != host_message) {
      diff += "async error: gpu " + std::string(moe_ep_status_string(gpu_async)) + " '" + gpu_message + "', host " +
              moe_ep_status_string(host_async) + " '" + host_message + "'\n";
    }
    if (!diff.empty()) failures << "rank " << rank << " round " << round << ": " << spec.describe() << "\n" << diff;
  }
  if (graph_exec) cudaGraphExecDestroy(graph_exec);
  return failures.str();
}

}  // namespace moe_ep_test
