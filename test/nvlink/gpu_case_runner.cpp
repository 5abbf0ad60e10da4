#include "gpu_case_runner.hpp"

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
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

uint64_t tensor_bytes(const moe_ep_tensor_t& t) {
  uint64_t elements = 1;
  for (int i = 0; i < t.ndim; ++i) elements *= static_cast<uint64_t>(t.shape[i]);
  return (elements * t.dtype.bits * t.dtype.lanes + 7) / 8;
}

void poison(const moe_ep_tensor_t& t) {
  if (t.data == nullptr) return;
  cuda_ok(cudaMemset(static_cast<char*>(t.data) + t.byte_offset, kPoison, tensor_bytes(t)), "cudaMemset(poison)");
}

// The tensors of a dispatch result that read_dispatch reads.
std::array<moe_ep_tensor_t*, 7> result_tensors(moe_ep_dispatch_result_t& r) {
  return {&r.hidden_states,       &r.topk_ids,           &r.topk_weights, &r.hidden_states_scale, &r.recv_counts,
          &r.local_expert_counts, &r.eplb_gathered_stats};
}

void poison_results(moe_ep_dispatch_result_t& r, const moe_ep_tensor_t& output) {
  for (const moe_ep_tensor_t* t : result_tensors(r)) poison(*t);
  poison(output);
}

void expect_ok(moe_ep_status_t s, const char* what) {
  if (s == MOE_EP_ERROR_UNSUPPORTED) throw GpuCaseUnsupported(moe_ep_last_error());
  if (s != MOE_EP_SUCCESS) {
    throw std::runtime_error(std::string(what) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error());
  }
}

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

// Copies of a dispatch result's tensors, taken on the stream right after the
// receive half: a slot's dispatch results are valid only until its
// combine_send is issued (docs/overlap.md, Buffer validity), and a round reads
// them back after its combine.  Sized once for the workload, so that the
// copies a graph captures keep their addresses.
class ResultSnapshot {
 public:
  explicit ResultSnapshot(const WorkloadSpec& s) {
    const uint64_t P = uint64_t(s.world) * uint64_t(s.max_tokens_per_rank);
    const uint64_t bytes[] = {P * s.hidden_row_bytes(),
                              P * uint64_t(s.top_k) * 4,
                              P * uint64_t(s.top_k) * 4,
                              P * s.scale_row_bytes(),
                              uint64_t(s.world) * 4,
                              uint64_t(s.experts_per_rank()) * 4,
                              uint64_t(s.world) * uint64_t(s.num_experts) * 4};
    for (const uint64_t b : bytes) copies_.push_back(std::make_unique<DeviceBuffer>(b));
  }

  // Enqueues the copies of r's tensors; returns r with each tensor aimed at its copy.
  moe_ep_dispatch_result_t take(const moe_ep_dispatch_result_t& r, cudaStream_t stream) {
    moe_ep_dispatch_result_t copy = r;
    const auto tensors = result_tensors(copy);
    for (size_t i = 0; i < tensors.size(); ++i) {
      moe_ep_tensor_t& t = *tensors[i];
      const uint64_t bytes = t.data == nullptr ? 0 : tensor_bytes(t);
      if (bytes == 0) continue;
      if (bytes > copies_[i]->size()) {
        throw std::runtime_error("dispatch result tensor " + std::to_string(i) + ": " + std::to_string(bytes) +
                                 " bytes, more than the workload's " + std::to_string(copies_[i]->size()));
      }
      cuda_ok(cudaMemcpyAsync(copies_[i]->get(), static_cast<const char*>(t.data) + t.byte_offset, bytes,
                              cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync(dispatch result copy)");
      t.data = copies_[i]->get();
      t.byte_offset = 0;
    }
    return copy;
  }

  void poison() {
    for (const auto& c : copies_) {
      if (c->size()) cuda_ok(cudaMemset(c->get(), kPoison, c->size()), "cudaMemset(poison copy)");
    }
  }

 private:
  std::vector<std::unique_ptr<DeviceBuffer>> copies_;  // in result_tensors' order
};

// One micro-batch on this rank: its workload, its inputs on the device, and
// what the GPU handle returned for it.
struct Lane {
  Lane(const WorkloadSpec& s, int32_t slot_in) : spec(s), slot(slot_in), gpu(s), snapshot(s) {
    moe_ep_dispatch_result_init(&result, sizeof result);
    moe_ep_combine_result_init(&combined, sizeof combined);
    taken = result;
  }

  WorkloadSpec spec;  // round 0's workload; each round draws from it (round_spec)
  int32_t slot;
  DeviceInputs gpu;
  ResultSnapshot snapshot;
  moe_ep_dispatch_result_t result;  // as the receive half wrote it
  moe_ep_dispatch_result_t taken;   // the same, aimed at the snapshot (split phases)
  moe_ep_combine_result_t combined;
  bool have_results = false;

  // This round's.
  WorkloadSpec w;
  RankInputs data;
  std::vector<uint8_t> eo;
  int T = 0;
  std::optional<DispatchArgs> args;
  std::optional<TensorView> output;
  const void* eo_address = nullptr;  // the expert output combine takes: own buffer or the view
};

// A step of a round: a micro-batch's half, or (fused phases) a fused call.
constexpr int kFusedDispatch = 4;
constexpr int kFusedCombine = 5;
struct Step {
  int lane;
  int half;  // GpuHalf, or kFusedDispatch / kFusedCombine
};

bool is_send(const Step& s) { return s.half == kDispatchSend || s.half == kCombineSend; }

const char* half_name(int half) {
  switch (half) {
    case kDispatchSend: return "moe_ep_dispatch_send";
    case kDispatchRecv: return "moe_ep_dispatch_recv";
    case kCombineSend: return "moe_ep_combine_send";
    case kCombineRecv: return "moe_ep_combine_recv";
    case kFusedDispatch: return "moe_ep_dispatch";
    default: return "moe_ep_combine";
  }
}

// The round's steps on the GPU handle, in issue order.
std::vector<Step> round_steps(const GpuCaseOptions& o) {
  if (o.phases == GpuPhases::fused) return {{0, kFusedDispatch}, {0, kFusedCombine}};
  std::vector<Step> steps;
  for (const GpuStep& s : split_round_steps(o)) steps.push_back({s.micro_batch, s.half});
  return steps;
}

// The graphs a round is captured in: one, or (graph_per_kind) one per run of
// sends and per run of receives.
std::vector<std::vector<Step>> graph_segments(const std::vector<Step>& steps, bool per_kind) {
  std::vector<std::vector<Step>> segments;
  for (const Step& s : steps) {
    if (segments.empty() || (per_kind && is_send(s) != is_send(segments.back().back()))) segments.emplace_back();
    segments.back().push_back(s);
  }
  return segments;
}

// A graph has fixed shapes: fix every rank's T.
void fix_tokens(WorkloadSpec& spec) {
  if (!spec.tokens.empty()) return;
  std::vector<int> drawn;  // drawn before filling spec.tokens: num_tokens() reads it once it is set
  for (int r = 0; r < spec.world; ++r) drawn.push_back(spec.num_tokens(r));
  spec.tokens = drawn;
}

struct GraphExecs {
  ~GraphExecs() {
    for (cudaGraphExec_t e : execs) cudaGraphExecDestroy(e);
  }
  std::vector<cudaGraphExec_t> execs;
};

}  // namespace

CaseHandle::CaseHandle(const moe_ep_bootstrap_t& b, const WorkloadSpec& spec, int32_t backend, const GpuCaseOptions& o,
                       int device) {
  moe_ep_params_t params = spec.params();
  moe_ep_config_t config;
  moe_ep_config_init(&config, sizeof config);
  config.backend = backend;
  config.timeout_ms = o.timeout_ms;
  config.num_sms = o.num_sms;
  config.device = backend == MOE_EP_BACKEND_HOST ? -1 : device;
  config.zero_copy_combine = backend != MOE_EP_BACKEND_HOST && o.zero_copy_combine ? 1 : 0;
  config.micro_batches = backend == MOE_EP_BACKEND_HOST ? 1 : o.micro_batches();
  const moe_ep_status_t s = moe_ep_create(&b, &params, &config, &h_);
  if (s == MOE_EP_ERROR_UNSUPPORTED) throw GpuCaseUnsupported(std::string("moe_ep_create: ") + moe_ep_last_error());
  if (s != MOE_EP_SUCCESS) throw std::runtime_error(std::string("moe_ep_create: ") + moe_ep_last_error());
}

CaseHandle::~CaseHandle() { moe_ep_destroy(&h_); }

double CaseHandle::destroy() {
  const auto start = std::chrono::steady_clock::now();
  moe_ep_destroy(&h_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<GpuStep> split_round_steps(const GpuCaseOptions& o) {
  switch (o.phases) {
    case GpuPhases::fused: throw std::runtime_error("split_round_steps: fused phases have no halves");
    case GpuPhases::split: return {{0, kDispatchSend}, {0, kDispatchRecv}, {0, kCombineSend}, {0, kCombineRecv}};
    case GpuPhases::micro_batches2: break;
  }
  const std::vector<int> order = o.interleaving.empty() ? std::vector<int>{0, 1, 0, 0, 1, 0, 1, 1} : o.interleaving;
  const char* const rule = "GpuCaseOptions::interleaving: micro-batches 0 and 1, four halves each";
  std::vector<GpuStep> steps;
  int next[2] = {0, 0};
  for (const int who : order) {
    if ((who != 0 && who != 1) || next[who] == 4) throw std::runtime_error(rule);
    steps.push_back({who, static_cast<GpuHalf>(next[who]++)});
  }
  if (next[0] != 4 || next[1] != 4) throw std::runtime_error(rule);
  return steps;
}

int32_t gpu_backend_under_test() {
  const char* v = std::getenv("MOE_EP_TEST_GPU_BACKEND");
  return v != nullptr && std::strcmp(v, "nccl") == 0 ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_NVLINK_TWO_SIDED;
}

std::string split_phases_unsupported(const WorkloadSpec& spec, const moe_ep_bootstrap_t& b, const GpuCaseOptions& o) {
  if (o.phases == GpuPhases::fused) return "";
  const int device = o.device >= 0 ? o.device : gpu_device();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  try {
    CaseHandle h(b, spec, o.backend, o, device);
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    const moe_ep_status_t s = moe_ep_dispatch_recv(h.get(), 0, &r, nullptr);
    if (s == MOE_EP_ERROR_UNSUPPORTED) return moe_ep_last_error();
    if (s != MOE_EP_ERROR_INVALID_STATE) {
      throw std::runtime_error(std::string("moe_ep_dispatch_recv on an idle slot: expected INVALID_STATE, got ") +
                               moe_ep_status_string(s) + ": " + moe_ep_last_error());
    }
  } catch (const GpuCaseUnsupported& e) {
    return e.what();
  }
  return "";
}

std::string run_gpu_case(const WorkloadSpec& spec_in, const moe_ep_bootstrap_t& b, const GpuCaseOptions& o) {
  const int rank = b.rank;
  const int device = o.device >= 0 ? o.device : gpu_device();
  cuda_ok(cudaSetDevice(device), "cudaSetDevice");
  const bool split = o.phases != GpuPhases::fused;
  if (o.graph && o.zero_copy_combine)
    throw std::runtime_error("run_gpu_case: zero_copy_combine runs eager rounds only");
  if (o.graph_per_kind && !split) throw std::runtime_error("run_gpu_case: graph_per_kind needs split phases");
  if (o.slot_of_a != 0 && (o.phases != GpuPhases::micro_batches2 || o.slot_of_a != 1)) {
    throw std::runtime_error("run_gpu_case: slot_of_a is 0, or 1 with micro_batches2");
  }
  const std::vector<Step> steps = round_steps(o);
  WorkloadSpec spec = spec_in;
  if (o.graph) fix_tokens(spec);
  std::vector<std::unique_ptr<Lane>> lanes;
  lanes.push_back(std::make_unique<Lane>(spec, o.slot_of_a));
  if (o.phases == GpuPhases::micro_batches2) {
    WorkloadSpec second = round_spec(spec_in, 1000);  // B's own seed (and token counts, when drawn)
    if (!o.second_tokens.empty()) second.tokens = o.second_tokens;
    if (o.graph) fix_tokens(second);
    lanes.push_back(std::make_unique<Lane>(second, 1 - o.slot_of_a));
  }
  CaseHandle nv(b, spec, o.backend, o, device);
  CaseHandle host(b, spec, MOE_EP_BACKEND_HOST, o, device);
  const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, device};
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<cudaStream_t, void (*)(cudaStream_t*)> stream_owner(&stream,
                                                                      [](cudaStream_t* s) { cudaStreamDestroy(*s); });
  GraphExecs graphs;
  std::ostringstream failures;
  std::vector<uint8_t> active(static_cast<size_t>(spec.world), 1);

  for (int round = 0; round < o.rounds; ++round) {
    if (o.active_ranks) {
      const std::vector<uint8_t> next = o.active_ranks(round);
      if (next != active) {
        const int32_t world = static_cast<int32_t>(next.size());
        expect_ok(moe_ep_set_active_ranks(nv.get(), next.data(), world), "set_active_ranks");
        expect_ok(moe_ep_set_active_ranks(host.get(), next.data(), world), "HOST set_active_ranks");
        active = next;
      }
    }
    for (const auto& lane_ptr : lanes) {
      Lane& lane = *lane_ptr;
      lane.w = round_spec(lane.spec, round);
      lane.data = make_rank_inputs(lane.w, rank);
      if (o.edit_inputs) o.edit_inputs(rank, lane.data);
      lane.T = lane.data.routing.num_tokens;
      lane.eo = make_expert_output(lane.w, rank);
      if (o.edit_expert_output) o.edit_expert_output(rank, round, lane.eo);
      lane.gpu.upload(lane.data, lane.eo);
      lane.args.emplace(lane.w, lane.T, lane.gpu.memory(), dev);
      lane.eo_address = lane.gpu.expert_output.get();
      lane.output.emplace(combine_output_view(lane.w, lane.gpu.output.get(), lane.T, dev));
      if (o.caller_output) {
        cuda_ok(cudaMemset(lane.gpu.output.get(), kPoison, size_t(lane.T) * lane.w.combine_row_bytes()), "poison");
      }
      if (lane.have_results) poison_results(lane.result, lane.combined.output);
      if (split) lane.snapshot.poison();
    }
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    // Nobody dispatches into memory that a peer is still poisoning.
    expect_ok(b.barrier(b.ctx) == 0 ? MOE_EP_SUCCESS : MOE_EP_ERROR_BOOTSTRAP, "barrier");

    // Issues one step on the stream (eager: with the zero-copy loads and the hooks).
    auto issue = [&](const Step& step, bool eager) {
      Lane& lane = *lanes[static_cast<size_t>(step.lane)];
      const bool combine_step = step.half == kCombineSend || step.half == kFusedCombine;
      if (eager && combine_step) {
        if (o.zero_copy_combine) {
          if (!o.zero_copy_passes_view || o.zero_copy_passes_view(rank, round)) {
            lane.eo_address = load_combine_input(lane.w, lane.result, lane.eo, stream);
          } else {
            poison_combine_input(lane.w, lane.result, stream);
          }
        }
        if (step.lane == 0 && o.between_dispatch_and_combine) o.between_dispatch_and_combine();
      }
      const TensorView own_eo = expert_output_view(lane.w, lane.gpu.expert_output.get(), dev);
      if (eager && split && o.before_half) {
        o.before_half(GpuHalfCall{nv.get(), round, step.lane, lane.slot, o.micro_batches(),
                                  static_cast<GpuHalf>(step.half), lane.args->get(), own_eo.get(), stream});
      }
      const TensorView eo = expert_output_view(lane.w, lane.eo_address, dev);
      const moe_ep_tensor_t* out = o.caller_output ? lane.output->get() : nullptr;
      const std::string what = std::string(half_name(step.half)) + (eager ? "" : " (capture)");
      moe_ep_status_t s = MOE_EP_SUCCESS;
      switch (step.half) {
        case kFusedDispatch: s = moe_ep_dispatch(nv.get(), lane.args->get(), &lane.result, stream); break;
        case kFusedCombine: s = moe_ep_combine(nv.get(), eo.get(), out, &lane.combined, stream); break;
        case kDispatchSend: s = moe_ep_dispatch_send(nv.get(), lane.slot, lane.args->get(), stream); break;
        case kDispatchRecv: s = moe_ep_dispatch_recv(nv.get(), lane.slot, &lane.result, stream); break;
        case kCombineSend: s = moe_ep_combine_send(nv.get(), lane.slot, eo.get(), stream); break;
        default: s = moe_ep_combine_recv(nv.get(), lane.slot, out, &lane.combined, stream);
      }
      expect_ok(s, what.c_str());
      if (step.half == kDispatchRecv) lane.taken = lane.snapshot.take(lane.result, stream);
    };
    if (o.graph && graphs.execs.empty()) {
      for (const std::vector<Step>& segment : graph_segments(steps, o.graph_per_kind)) {
        cudaGraph_t graph = nullptr;
        cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
        try {
          for (const Step& step : segment) issue(step, false);
        } catch (...) {
          if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
          throw;
        }
        cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
        cudaGraphExec_t exec = nullptr;
        const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
        cudaGraphDestroy(graph);
        cuda_ok(rc, "cudaGraphInstantiate");
        graphs.execs.push_back(exec);
      }
    }
    if (o.graph) {
      for (cudaGraphExec_t exec : graphs.execs) cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    } else {
      for (const Step& step : steps) issue(step, true);
    }
    for (const auto& lane : lanes) lane->have_results = true;

    // The same round through the HOST backend, on host copies of the inputs:
    // each micro-batch as a fused pair.
    std::vector<Verdict> verdicts(lanes.size());
    std::vector<ReceivedDispatch> host_copies;
    std::vector<std::vector<uint8_t>> host_outs;
    for (size_t i = 0; i < lanes.size(); ++i) {
      const Lane& lane = *lanes[i];
      DispatchArgs host_args(lane.w, lane.T, host_memory(lane.data));
      const TensorView host_eo = expert_output_view(lane.w, lane.eo.data(), host_device());
      moe_ep_dispatch_result_t host_result;
      moe_ep_dispatch_result_init(&host_result, sizeof host_result);
      expect_ok(moe_ep_dispatch(host.get(), host_args.get(), &host_result, nullptr), "HOST dispatch");
      host_copies.push_back(read_dispatch(lane.w, host_result, host_device(), read_host_memory, verdicts[i]));
      moe_ep_combine_result_t host_combined;
      moe_ep_combine_result_init(&host_combined, sizeof host_combined);
      expect_ok(moe_ep_combine(host.get(), host_eo.get(), nullptr, &host_combined, nullptr), "HOST combine");
      host_outs.push_back(read_combine(lane.w, host_combined, lane.T, host_device(), read_host_memory, verdicts[i]));
    }

    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    for (size_t i = 0; i < lanes.size(); ++i) {
      const Lane& lane = *lanes[i];
      Verdict& v = verdicts[i];
      const ReceivedDispatch gpu_copy =
          read_dispatch(lane.w, split ? lane.taken : lane.result, dev, read_device_memory, v);
      const std::vector<uint8_t> gpu_out = read_combine(lane.w, lane.combined, lane.T, dev, read_device_memory, v);
      v.merge(compare_dispatch(lane.w, host_copies[i], gpu_copy));
      std::string diff = v.wrong ? std::to_string(v.wrong) + " wrong:\n" + v.details : "";
      if (!same_combine_output(gpu_out, host_outs[i], lane.w.combine_dtype, o.nans_compare_equal)) {
        // bitwise: both reduce in fp32 in ascending rank order
        const std::vector<uint8_t>& host_out = host_outs[i];
        size_t first = 0;
        while (first < gpu_out.size() && first < host_out.size() && gpu_out[first] == host_out[first]) ++first;
        diff += "combine output differs (" + std::to_string(gpu_out.size()) + " vs " + std::to_string(host_out.size()) +
                " bytes, first at byte " + std::to_string(first) + ")\n";
      }
      if (!diff.empty()) {
        failures << "rank " << rank << " round " << round;
        if (lanes.size() > 1) failures << " micro-batch " << (i == 0 ? "A" : "B") << " (slot " << lane.slot << ")";
        failures << ": " << lane.w.describe() << "\n" << diff;
      }
    }
    // Device-side errors: the GPU must report exactly what the HOST backend reports.
    moe_ep_status_t gpu_async = MOE_EP_SUCCESS, host_async = MOE_EP_SUCCESS;
    expect_ok(moe_ep_get_async_error(nv.get(), &gpu_async), "moe_ep_get_async_error (gpu)");
    const std::string gpu_message = gpu_async ? moe_ep_last_error() : "";
    expect_ok(moe_ep_get_async_error(host.get(), &host_async), "moe_ep_get_async_error (host)");
    const std::string host_message = host_async ? moe_ep_last_error() : "";
    if (gpu_async != host_async || gpu_message != host_message) {
      failures << "rank " << rank << " round " << round << ": async error: gpu " << moe_ep_status_string(gpu_async)
               << " '" << gpu_message << "', host " << moe_ep_status_string(host_async) << " '" << host_message
               << "'\n";
    }
  }
  return failures.str();
}

}  // namespace moe_ep_test
