#include "ep_calls.hpp"

#include <cstring>
#include <sstream>

#include "dtypes.hpp"
#include "errors.hpp"

namespace moe_ep_tool {

EpHandle::EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params,
                   const moe_ep_config_t& config) {
  TOOL_CHECK_MOE(moe_ep_create(&bootstrap, &params, &config, &handle_));
}

EpHandle::~EpHandle() {
  // Collective like create; a failure here cannot be reported from a destructor
  // and leaves nothing behind that matters to the results.
  moe_ep_destroy(&handle_);
}

Tensor::Tensor(void* data, const moe_ep_device_t& device, const moe_ep_dtype_t& dtype,
               std::initializer_list<int64_t> dims) {
  int i = 0;
  for (int64_t d : dims) shape_[i++] = d;
  tensor_.data = data;
  tensor_.device = device;
  tensor_.ndim = i;
  tensor_.dtype = dtype;
  tensor_.strides = nullptr;
  tensor_.byte_offset = 0;
}

namespace {
const moe_ep_dtype_t kInt32{MOE_EP_DTYPE_INT, 32, 1};
const moe_ep_dtype_t kFloat32{MOE_EP_DTYPE_FLOAT, 32, 1};
}  // namespace

DispatchInputs::DispatchInputs(const WorkloadSpec& s, const Place& place)
    : place_(place),
      hidden_(place, uint64_t(s.max_tokens_per_rank) * s.hidden_row_bytes()),
      ids_(place, uint64_t(s.max_tokens_per_rank) * s.top_k * sizeof(int32_t)),
      weights_(place, uint64_t(s.max_tokens_per_rank) * s.top_k * sizeof(float)),
      scales_(place, uint64_t(s.max_tokens_per_rank) * s.scale_row_bytes()),
      eplb_(place, uint64_t(s.num_experts) * sizeof(int32_t)) {}

void DispatchInputs::load(const WorkloadSpec& s, int rank, const RankRouting& routing, void* stream) {
  num_tokens_ = routing.num_tokens;
  hidden_.upload(make_hidden(s, rank), stream);
  ids_.upload(routing.topk_ids, stream);
  weights_.upload(routing.topk_weights, stream);
  if (s.scale_row_elems) scales_.upload(make_scales(s, rank), stream);
  if (s.eplb_given) eplb_.upload(make_eplb_local(s, rank), stream);
}

moe_ep_status_t DispatchInputs::dispatch(moe_ep_handle_t handle, const WorkloadSpec& s,
                                         moe_ep_dispatch_result_t* result, void* stream) {
  const moe_ep_device_t dev = place_.dlpack();
  const int64_t T = num_tokens_;
  Tensor hidden(hidden_.data(), dev, s.hidden_dtype, {T, s.row_elems()});
  Tensor ids(ids_.data(), dev, kInt32, {T, s.top_k});
  Tensor weights(weights_.data(), dev, kFloat32, {T, s.top_k});
  Tensor scales(scales_.data(), dev, s.scale_dtype, {T, s.scale_row_elems});
  Tensor eplb(eplb_.data(), dev, kInt32, {s.num_experts});
  moe_ep_dispatch_args_t args;
  TOOL_CHECK_MOE(moe_ep_dispatch_args_init(&args));
  args.hidden_states = hidden.get();
  args.topk_ids = ids.get();
  args.topk_weights = s.weights ? weights.get() : nullptr;
  args.hidden_states_scale = s.scale_row_elems ? scales.get() : nullptr;
  args.runtime_max_tokens_per_rank = s.runtime_max_tokens_per_rank;
  args.eplb_local_stats = s.eplb_given ? eplb.get() : nullptr;
  TOOL_CHECK_MOE(moe_ep_dispatch_result_init(result));
  return moe_ep_dispatch(handle, &args, result, stream);
}

moe_ep_status_t run_combine(moe_ep_handle_t handle, const WorkloadSpec& s, const Place& place,
                            const Buffer& expert_output, bool as_3d, const Buffer* output, int num_tokens,
                            moe_ep_combine_result_t* result, void* stream) {
  const moe_ep_device_t dev = place.dlpack();
  Tensor flat(expert_output.data(), dev, s.combine_dtype, {s.receive_rows(), s.hidden_size});
  Tensor cube(expert_output.data(), dev, s.combine_dtype, {s.world, s.tokens_per_rank(), s.hidden_size});
  Tensor out(output ? output->data() : nullptr, dev, s.combine_dtype, {num_tokens, s.hidden_size});
  TOOL_CHECK_MOE(moe_ep_combine_result_init(result));
  return moe_ep_combine(handle, as_3d ? cube.get() : flat.get(), output ? out.get() : nullptr, result, stream);
}

namespace {

std::string describe(const moe_ep_tensor_t& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype) << "[";
  for (int i = 0; i < t.ndim && t.shape; ++i) os << (i ? "," : "") << t.shape[i];
  os << "] on device type " << t.device.device_type << " id " << t.device.device_id;
  return os.str();
}

// Checks one result tensor; returns its bytes when it is as expected, else
// records one wrong element and returns an empty vector.
std::vector<uint8_t> take(const char* name, const moe_ep_tensor_t& t, const moe_ep_dtype_t& dtype,
                          std::initializer_list<int64_t> dims, const Place& place, void* stream, Verdict& v) {
  bool ok = t.ndim == int(dims.size()) && same_dtype(t.dtype, dtype) && t.shape != nullptr &&
            t.device.device_type == place.dlpack().device_type && t.device.device_id == place.dlpack().device_id &&
            t.strides == nullptr;
  int64_t elems = 1, i = 0;
  for (int64_t d : dims) {
    ok = ok && t.shape[i++] == d;
    elems *= d;
  }
  if (!ok) {
    std::ostringstream os;
    os << name << ": expected " << dtype_name(dtype) << "[";
    for (int64_t d : dims) os << d << ",";
    os << "] compact on " << (place.device ? "the device" : "the host") << ", got " << describe(t);
    v.add(1, os.str());
    return {};
  }
  // Rows of sub-byte types are padded to whole bytes (as the library lays them out).
  const int64_t last = *(dims.end() - 1);
  const uint64_t bytes = last ? uint64_t(elems / last) * row_bytes(dtype, last) : 0;
  return download(place, static_cast<const char*>(t.data) + t.byte_offset, bytes, stream);
}

template <typename T>
std::vector<T> as(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

bool absent(const moe_ep_tensor_t& t) { return t.data == nullptr && t.ndim == 0; }

}  // namespace

ReceivedDispatch read_dispatch(const WorkloadSpec& s, const Place& place, const moe_ep_dispatch_result_t& r,
                               void* stream, Verdict& v) {
  ReceivedDispatch got;
  got.tokens_per_rank = r.tokens_per_rank;
  const int64_t P = s.receive_rows(), K = s.top_k;
  got.hidden = take("hidden_states", r.hidden_states, s.hidden_dtype, {P, s.row_elems()}, place, stream, v);
  got.topk_ids = as<int32_t>(take("topk_ids", r.topk_ids, kInt32, {P, K}, place, stream, v));
  got.recv_counts = as<int32_t>(take("recv_counts", r.recv_counts, kInt32, {s.world}, place, stream, v));
  got.local_expert_counts = as<int32_t>(
      take("local_expert_counts", r.local_expert_counts, kInt32, {s.experts_per_rank()}, place, stream, v));
  got.has_weights = !absent(r.topk_weights);
  if (got.has_weights && s.weights) {
    got.topk_weights = as<float>(take("topk_weights", r.topk_weights, kFloat32, {P, K}, place, stream, v));
  }
  got.has_scales = !absent(r.hidden_states_scale);
  if (s.scale_row_elems) {
    got.scales = take("hidden_states_scale", r.hidden_states_scale, s.scale_dtype, {P, s.scale_row_elems}, place,
                      stream, v);
  } else if (got.has_scales) {
    v.add(1, "hidden_states_scale: returned although params have no scales");
  }
  got.has_eplb = !absent(r.eplb_gathered_stats);
  if (s.eplb_stats) {
    got.eplb_gathered = as<int32_t>(
        take("eplb_gathered_stats", r.eplb_gathered_stats, kInt32, {s.world, s.num_experts}, place, stream, v));
  } else if (got.has_eplb) {
    v.add(1, "eplb_gathered_stats: returned although eplb stats are off");
  }
  return got;
}

void poison_dispatch_payload(const WorkloadSpec& s, const Place& place, const moe_ep_dispatch_result_t& r,
                             void* stream) {
  const uint64_t P = uint64_t(s.receive_rows());
  fill_at(place, r.hidden_states.data, P * s.hidden_row_bytes(), 0xA5, stream);
  if (s.scale_row_elems) fill_at(place, r.hidden_states_scale.data, P * s.scale_row_bytes(), 0xA5, stream);
}

std::vector<uint8_t> read_combine(const WorkloadSpec& s, const Place& place, const moe_ep_combine_result_t& r,
                                  int num_tokens, void* stream, Verdict& v) {
  if (num_tokens == 0) {  // data may be NULL; only the shape is specified
    const bool ok = r.output.ndim == 2 && r.output.shape && r.output.shape[0] == 0 &&
                    r.output.shape[1] == s.hidden_size && same_dtype(r.output.dtype, s.combine_dtype);
    if (!ok) v.add(1, "combine output for 0 tokens: expected " + dtype_name(s.combine_dtype) + "[0," +
                          std::to_string(s.hidden_size) + "], got " + describe(r.output));
    return {};
  }
  return take("combine output", r.output, s.combine_dtype, {num_tokens, s.hidden_size}, place, stream, v);
}

}  // namespace moe_ep_tool
