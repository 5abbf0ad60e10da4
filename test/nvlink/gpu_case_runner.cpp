#include "gpu_case_runner.hpp"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "gpu_test_env.hpp"
#include "host_case_runner.hpp"
#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"

namespace moe_ep_test {

using namespace moe_ep_verify;

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

std::vector<uint8_t> read_device_memory(const void* data, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  if (bytes) cuda_ok(cudaMemcpy(out.data(), data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

// Whether the element at `p` (bf16, fp16 or fp32) is a NaN.
bool is_nan(const uint8_t* p, moe_ep_dtype_t dtype) {
  if (dtype.bits == 32) {
    uint32_t u;
    std::memcpy(&u, p, 4);
    return (u & 0x7FFFFFFFu) > 0x7F800000u;
  }
  uint16_t u;
  std::memcpy(&u, p, 2);
  return (u & 0x7FFFu) > (dtype.code == MOE_EP_DTYPE_BFLOAT ? 0x7F80u : 0x7C00u);
}

// Bit for bit, or (nans_equal) with any two NaNs of `dtype` equal.
bool same_combine_output(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, moe_ep_dtype_t dtype,
                         bool nans_equal) {
  if (a == b) return true;
  if (!nans_equal || a.size() != b.size()) return false;
  const size_t size = dtype.bits / 8;
  for (size_t i = 0; i + size <= a.size(); i += size) {
    if (std::memcmp(&a[i], &b[i], size) != 0 && !(is_nan(&a[i], dtype) && is_nan(&b[i], dtype))) return false;
  }
  return true;
}

void poison(const moe_ep_tensor_t& t) {
  if (t.data == nullptr) return;
  uint64_t elements = 1;
  for (int i = 0; i < t.ndim; ++i) elements *= static_cast<uint64_t>(t.shape[i]);
  const uint64_t bytes = (elements * t.dtype.bits * t.dtype.lanes + 7) / 8;
  cuda_ok(cudaMemset(static_cast<char*>(t.data) + t.byte_offset, kPoison, bytes), "cudaMemset(poison)");
}

void poison_results(const moe_ep_dispatch_result_t& r, const moe_ep_tensor_t& output) {
  for (const moe_ep_tensor_t* t : {&r.hidden_states, &r.topk_ids, &r.topk_weights, &r.hidden_states_scale,
                                   &r.recv_counts, &r.local_expert_counts, &r.eplb_gathered_stats, &output}) {
    poison(*t);
  }
}

class Handle {
 public:
  Handle(const moe_ep_bootstrap_t& b, const WorkloadSpec& spec, int32_t backend, const GpuCaseOptions& o, int device) {
    moe_ep_params_t params = spec.params();
    moe_ep_config_t config;
    moe_ep_config_init(&config, sizeof config);
    config.backend = backend;
    config.timeout_ms = o.timeout_ms;
    config.num_sms = o.num_sms;
    config.device = backend == MOE_EP_BACKEND_HOST ? -1 : device;
    config.zero_copy_combine = backend != MOE_EP_BACKEND_HOST && o.zero_copy_combine ? 1 : 0;
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

// One rank's tensors on the GPU, sized for max_tokens_per_rank rows at fixed
// addresses, so that a captured graph sees each round's new contents.
struct DeviceInputs {
  explicit DeviceInputs(const WorkloadSpec& s)
      : hidden(size_t(s.max_tokens_per_rank) * s.hidden_row_bytes() + 16),
        ids(size_t(s.max_tokens_per_rank) * s.top_k * 4),
        weights(size_t(s.max_tokens_per_rank) * s.top_k * 4),
        scales(size_t(s.max_tokens_per_rank) * s.scale_row_bytes() + 16),
        eplb(size_t(s.num_experts) * 4),
        expert_output(size_t(s.world) * s.max_tokens_per_rank * s.combine_row_bytes()),
        output(size_t(s.max_tokens_per_rank) * s.combine_row_bytes()) {}

  void upload(const RankInputs& in, const std::vector<uint8_t>& eo) {
    hidden.upload(in.hidden.data(), in.hidden.size());
    ids.upload(in.routing.topk_ids.data(), in.routing.topk_ids.size() * 4);
    weights.upload(in.routing.topk_weights.data(), in.routing.topk_weights.size() * 4);
    scales.upload(in.scales.data(), in.scales.size());
    eplb.upload(in.eplb_local.data(), in.eplb_local.size() * 4);
    expert_output.upload(eo.data(), eo.size());
  }
  DispatchMemory memory() const { return {hidden.get(), ids.get(), weights.get(), scales.get(), eplb.get()}; }

  DeviceBuffer hidden, ids, weights, scales, eplb, expert_output, output;
};

// Writes the expert output into the dispatch result's combine_input view (on
// the stream, after the dispatch) and returns the view's address.
const void* load_combine_input(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r, const std::vector<uint8_t>& eo,
                               cudaStream_t stream) {
  const moe_ep_tensor_t& v = r.combine_input;
  if (v.data == nullptr || v.ndim != 2 || v.shape[0] != w.receive_rows() || v.shape[1] != w.hidden_size) {
    throw std::runtime_error("zero_copy_combine: the dispatch result has no [P, hidden] combine_input view");
  }
  cuda_ok(cudaMemcpyAsync(v.data, eo.data(), eo.size(), cudaMemcpyHostToDevice, stream), "upload into combine_input");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return v.data;
}

// Poisons the dispatch result's combine_input view (on the stream).
void poison_combine_input(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r, cudaStream_t stream) {
  if (r.combine_input.data == nullptr) throw std::runtime_error("zero_copy_combine: no combine_input view to poison");
  cuda_ok(cudaMemsetAsync(r.combine_input.data, kPoison, size_t(w.receive_rows()) * w.combine_row_bytes(), stream),
          "poison combine_input");
}

}  // namespace

int32_t gpu_backend_under_test() {
  const char* v = std::getenv("MOE_EP_TEST_GPU_BACKEND");
  return v != nullptr && std::strcmp(v, "nccl") == 0 ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_NVLINK_TWO_SIDED;
}

std::string run_gpu_case(const WorkloadSpec& spec_in, const moe_ep_bootstrap_t& b, const GpuCaseOptions& o) {
  const int rank = b.rank;
  const int device = o.device >= 0 ? o.device : gpu_device();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  WorkloadSpec spec = spec_in;
  if (o.graph && o.zero_copy_combine)
    throw std::runtime_error("run_gpu_case: zero_copy_combine runs eager rounds only");
  if (o.graph && spec.tokens.empty()) {  // a graph has fixed shapes: fix every rank's T
    std::vector<int> drawn;  // drawn before filling spec.tokens: num_tokens() reads it once it is set
    for (int r = 0; r < spec.world; ++r) drawn.push_back(spec.num_tokens(r));
    spec.tokens = drawn;
  }
  Handle nv(b, spec, o.backend, o, device);
  Handle host(b, spec, MOE_EP_BACKEND_HOST, o, device);
  const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device};
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<cudaStream_t, void (*)(cudaStream_t*)> stream_owner(&stream,
                                                                      [](cudaStream_t* s) { cudaStreamDestroy(*s); });

  DeviceInputs gpu(spec);
  moe_ep_dispatch_result_t gpu_result;
  moe_ep_dispatch_result_init(&gpu_result, sizeof gpu_result);
  moe_ep_combine_result_t gpu_combined;
  moe_ep_combine_result_init(&gpu_combined, sizeof gpu_combined);
  cudaGraphExec_t graph_exec = nullptr;
  bool have_results = false;
  std::ostringstream failures;

  for (int round = 0; round < o.rounds; ++round) {
    const WorkloadSpec w = round_spec(spec, round);
    RankInputs data = make_rank_inputs(w, rank);
    if (o.edit_inputs) o.edit_inputs(rank, data);
    const int T = data.routing.num_tokens;
    std::vector<uint8_t> eo = make_expert_output(w, rank);
    if (o.edit_expert_output) o.edit_expert_output(rank, round, eo);
    gpu.upload(data, eo);
    DispatchArgs gpu_args(w, T, gpu.memory(), dev);
    const void* gpu_eo_address = gpu.expert_output.get();  // or the combine_input view (zero-copy)
    const TensorView gpu_output = combine_output_view(w, gpu.output.get(), T, dev);
    if (o.caller_output) {
      cuda_ok(cudaMemset(gpu.output.get(), kPoison, size_t(T) * w.combine_row_bytes()), "poison");
    }
    if (have_results) poison_results(gpu_result, gpu_combined.output);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    // Nobody dispatches into memory that a peer is still poisoning.
    expect_ok(b.barrier(b.ctx) == 0 ? MOE_EP_SUCCESS : MOE_EP_ERROR_BOOTSTRAP, "barrier");

    auto gpu_dispatch = [&] { return moe_ep_dispatch(nv.get(), gpu_args.get(), &gpu_result, stream); };
    auto gpu_combine = [&] {
      const TensorView gpu_eo = expert_output_view(w, gpu_eo_address, dev);
      return moe_ep_combine(nv.get(), gpu_eo.get(), o.caller_output ? gpu_output.get() : nullptr, &gpu_combined,
                            stream);
    };
    if (o.graph && graph_exec == nullptr) {
      cudaGraph_t graph = nullptr;
      cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      expect_ok(gpu_dispatch(), "moe_ep_dispatch (capture)");
      expect_ok(gpu_combine(), "moe_ep_combine (capture)");
      cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
      cuda_ok(cudaGraphInstantiate(&graph_exec, graph, 0), "cudaGraphInstantiate");
      cudaGraphDestroy(graph);
    }
    if (o.graph) {
      cuda_ok(cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch");
    } else {
      expect_ok(gpu_dispatch(), "moe_ep_dispatch");
      if (o.zero_copy_combine) {
        if (!o.zero_copy_passes_view || o.zero_copy_passes_view(rank, round)) {
          gpu_eo_address = load_combine_input(w, gpu_result, eo, stream);
        } else {
          poison_combine_input(w, gpu_result, stream);
        }
      }
      if (o.between_dispatch_and_combine) o.between_dispatch_and_combine();
      expect_ok(gpu_combine(), "moe_ep_combine");
    }
    have_results = true;

    // The same round through the HOST backend, on host copies of the inputs.
    DispatchArgs host_args(w, T, host_memory(data));
    const TensorView host_eo = expert_output_view(w, eo.data(), host_device());
    moe_ep_dispatch_result_t host_result;
    moe_ep_dispatch_result_init(&host_result, sizeof host_result);
    expect_ok(moe_ep_dispatch(host.get(), host_args.get(), &host_result, nullptr), "HOST dispatch");
    Verdict v;
    const ReceivedDispatch host_copy = read_dispatch(w, host_result, host_device(), read_host_memory, v);
    moe_ep_combine_result_t host_combined;
    moe_ep_combine_result_init(&host_combined, sizeof host_combined);
    expect_ok(moe_ep_combine(host.get(), host_eo.get(), nullptr, &host_combined, nullptr), "HOST combine");
    const std::vector<uint8_t> host_out = read_combine(w, host_combined, T, host_device(), read_host_memory, v);

    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const ReceivedDispatch gpu_copy = read_dispatch(w, gpu_result, dev, read_device_memory, v);
    const std::vector<uint8_t> gpu_out = read_combine(w, gpu_combined, T, dev, read_device_memory, v);
    v.merge(compare_dispatch(w, host_copy, gpu_copy));
    std::string diff = v.wrong ? std::to_string(v.wrong) + " wrong:\n" + v.details : "";
    if (!same_combine_output(gpu_out, host_out, w.combine_dtype, o.nans_compare_equal)) {
      // bitwise: both reduce in fp32 in ascending rank order
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
    if (!diff.empty()) failures << "rank " << rank << " round " << round << ": " << w.describe() << "\n" << diff;
  }
  if (graph_exec) cudaGraphExecDestroy(graph_exec);
  return failures.str();
}

}  // namespace moe_ep_test
