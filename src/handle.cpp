#include "handle.hpp"

#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "dtype.hpp"
#include "bounded_exchange.hpp"
#include "error.hpp"
#include "host_backend.hpp"
#include "nvlink/nvlink_backend.hpp"
#include "tensor_check.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

int32_t resolve_backend_locally(const moe_ep_config_t& config) {
  if (config.backend == MOE_EP_BACKEND_HOST) return MOE_EP_BACKEND_HOST;
  const bool supported = nvlink_platform_supported(config.device);
  if (config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED && !supported) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on device ",
         config.device, " of this process (no CUDA driver, no GPU, or no backend in this build)");
  }
  return supported ? MOE_EP_BACKEND_NVLINK_TWO_SIDED : MOE_EP_BACKEND_HOST;
}

namespace {

// The fields every rank must agree on, compared by name after one allgather.
struct GroupFingerprint {
  int32_t values[14];
};
constexpr const char* kFingerprintNames[14] = {
    "params->num_experts", "params->top_k", "params->max_tokens_per_rank", "params->hidden_size",
    "params->hidden_dtype", "params->hidden_row_elems", "params->scale_row_elems",
    "params->scale_dtype", "params->invalid_expert_id", "params->enable_eplb_stats",
    "params->combine_dtype", "config->backend", "bootstrap->world_size", "config->timeout_ms"};

int32_t pack_dtype(const moe_ep_dtype_t& d) { return d.code | (d.bits << 8) | (d.lanes << 16); }

GroupFingerprint fingerprint(const Layout& l, int32_t backend, int32_t timeout_ms) {
  return GroupFingerprint{{l.num_experts, l.top_k, l.max_tokens_per_rank, l.hidden_size,
                           pack_dtype(l.hidden_dtype), l.hidden_row_elems, l.scale_row_elems,
                           pack_dtype(l.scale_dtype), l.invalid_expert_id, l.eplb_stats ? 1 : 0,
                           pack_dtype(l.combine_dtype), backend, l.world_size, timeout_ms}};
}

void check_same_on_every_rank(const Exchange& b, const GroupFingerprint& mine) {
  const std::vector<GroupFingerprint> all = b.allgather_value(mine, "create: parameter check");
  for (int32_t r = 0; r < b.world_size(); ++r) {
    for (int i = 0; i < 14; ++i) {
      if (all[r].values[i] != all[0].values[i]) {
        fail(MOE_EP_ERROR_INVALID_ARGUMENT, kFingerprintNames[i],
             ": expected the same value on every rank, got ", all[0].values[i], " on rank 0 and ",
             all[r].values[i], " on rank ", r);
      }
    }
  }
}

}  // namespace

namespace {

// The timeout this rank waits for its peers during create: its own
// config->timeout_ms (agreed across ranks later), or the default when the
// config is unreadable (that error is then reported through the agreement).
int32_t local_timeout_ms(const moe_ep_config_t* config_arg) {
  try {
    return read_config(config_arg).timeout_ms;
  } catch (const Error&) {
    return kDefaultTimeoutMs;
  }
}

// Builds the HOST backend and agrees on the outcome: an allocation that fails
// on one rank fails create on every rank instead of leaving the others to wait.
std::unique_ptr<Backend> create_host_backend(const Layout& layout, const std::shared_ptr<BoundedExchange>& exchange) {
  std::unique_ptr<Backend> backend;
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
  try {
    backend = make_host_backend(layout, exchange);
  } catch (const Error& e) {
    status = e.status();
    message = e.what();
  } catch (const std::bad_alloc&) {
    status = MOE_EP_ERROR_OUT_OF_MEMORY;
    message = "HOST backend on rank " + std::to_string(layout.rank) + ": out of host memory for its buffers";
  } catch (const std::length_error&) {
    status = MOE_EP_ERROR_OUT_OF_MEMORY;
    message = "HOST backend on rank " + std::to_string(layout.rank) + ": buffers too large to allocate";
  }
  exchange->agree(status, message);
  return backend;
}

}  // namespace

moe_ep_handle_s* create_handle(const moe_ep_bootstrap_t* bootstrap_arg, const moe_ep_params_t* params_arg,
                               const moe_ep_config_t* config_arg) {
  // Without a usable bootstrap there is no way to tell the peers: fail locally.
  const Bootstrap bootstrap(bootstrap_arg);
  // Every wait for a peer below is bounded by this rank's timeout_ms.
  auto exchange = std::make_shared<BoundedExchange>(bootstrap, local_timeout_ms(config_arg));

  // Local validation; its outcome is shared so that no rank waits for a rank that gave up.
  auto handle = std::make_unique<moe_ep_handle_s>();
  GroupFingerprint mine{};
  moe_ep_status_t local_status = MOE_EP_SUCCESS;
  std::string local_message;
  try {
    const moe_ep_params_t params = read_params(params_arg);
    handle->config = read_config(config_arg);
    handle->layout = make_layout(params, bootstrap.world_size(), bootstrap.rank());
    handle->config.backend = resolve_backend_locally(handle->config);
    mine = fingerprint(handle->layout, handle->config.backend, handle->config.timeout_ms);
  } catch (const Error& e) {
    local_status = e.status();
    local_message = e.what();
  }
  exchange->agree(local_status, local_message);

  // AUTO may resolve differently per rank (one rank without a GPU): all ranks
  // take the NVLink backend only if all of them can.
  const bool all_nvlink = [&] {
    const std::vector<int32_t> choices = exchange->allgather_value(handle->config.backend, "create: backend choice");
    for (int32_t c : choices) {
      if (c != MOE_EP_BACKEND_NVLINK_TWO_SIDED) return false;
    }
    return true;
  }();
  if (!all_nvlink && config_arg && read_config(config_arg).backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on every rank");
  }
  handle->config.backend = all_nvlink ? MOE_EP_BACKEND_NVLINK_TWO_SIDED : MOE_EP_BACKEND_HOST;
  mine.values[11] = handle->config.backend;
  check_same_on_every_rank(*exchange, mine);

  if (handle->config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED) {
    exchange.reset();  // idle: its worker is joined; the NVLink backend bounds its own waits
    handle->backend = make_nvlink_backend(handle->layout, handle->config, bootstrap);
  } else {
    handle->backend = create_host_backend(handle->layout, exchange);
  }
  return handle.release();
}

namespace {

void check_not_broken(const moe_ep_handle_s& h) {
  if (h.broken_status != MOE_EP_SUCCESS) throw Error(h.broken_status, h.broken_message);
}

DispatchCall validate_dispatch(const moe_ep_handle_s& h, const moe_ep_dispatch_args_t& a) {
  const Layout& l = h.layout;
  const moe_ep_device_t dev = h.backend->device();
  DispatchCall c;
  c.tokens_per_rank = a.runtime_max_tokens_per_rank ? a.runtime_max_tokens_per_rank : l.max_tokens_per_rank;
  if (a.runtime_max_tokens_per_rank < 0 || a.runtime_max_tokens_per_rank > l.max_tokens_per_rank) {
    fail_argument("args->runtime_max_tokens_per_rank",
                  "0 (= max_tokens_per_rank) or in [1, " + std::to_string(l.max_tokens_per_rank) + "]",
                  a.runtime_max_tokens_per_rank);
  }
  if (a.hidden_states == nullptr) fail_argument("args->hidden_states", "a tensor", "NULL");
  const std::vector<int64_t> hs = tensor_shape(*a.hidden_states, "args->hidden_states");
  if (hs.size() != 2) fail_argument("args->hidden_states ndim", 2, hs.size());
  if (hs[0] < 0 || hs[0] > c.tokens_per_rank) {
    fail_argument("args->hidden_states shape[0] (local_num_tokens)",
                  "in [0, tokens_per_rank = " + std::to_string(c.tokens_per_rank) + "]", hs[0]);
  }
  c.num_tokens = static_cast<int32_t>(hs[0]);
  const int64_t T = c.num_tokens;
  c.hidden = check_tensor(a.hidden_states, "args->hidden_states", l.hidden_dtype, {{T, l.hidden_row_elems}}, dev);
  c.topk_ids = static_cast<const int32_t*>(
      check_tensor(a.topk_ids, "args->topk_ids", dtype_int32(), {{T, l.top_k}}, dev));
  if (a.topk_weights) {
    c.has_weights = true;
    c.topk_weights = static_cast<const float*>(
        check_tensor(a.topk_weights, "args->topk_weights", dtype_fp32(), {{T, l.top_k}}, dev));
  }
  if (l.scale_row_elems > 0) {
    c.scales = check_tensor(a.hidden_states_scale, "args->hidden_states_scale", l.scale_dtype,
                            {{T, l.scale_row_elems}}, dev);
  } else if (a.hidden_states_scale != nullptr) {
    fail_argument("args->hidden_states_scale", "NULL (params->scale_row_elems is 0)", "a tensor");
  }
  if (a.eplb_local_stats) {
    if (!l.eplb_stats) fail_argument("args->eplb_local_stats", "NULL (params->enable_eplb_stats is 0)", "a tensor");
    c.eplb_local = static_cast<const int32_t*>(
        check_tensor(a.eplb_local_stats, "args->eplb_local_stats", dtype_int32(), {{l.num_experts}}, dev));
  }
  return c;
}

moe_ep_tensor_t view(void* data, const moe_ep_device_t& dev, const moe_ep_dtype_t& dtype,
                     int64_t* shape_storage, std::initializer_list<int64_t> shape) {
  moe_ep_tensor_t t{};
  if (data == nullptr) return t;  // absent: data NULL, ndim 0
  int i = 0;
  for (int64_t d : shape) shape_storage[i++] = d;
  t.data = data;
  t.device = dev;
  t.ndim = i;
  t.dtype = dtype;
  t.shape = shape_storage;
  return t;
}

}  // namespace

void dispatch(moe_ep_handle_s& h, const moe_ep_dispatch_args_t* args_arg,
              moe_ep_dispatch_result_t* result_arg, void* stream) {
  check_not_broken(h);
  moe_ep_dispatch_args_t defaults{};
  defaults.struct_size = sizeof(defaults);
  const moe_ep_dispatch_args_t args = read_versioned(args_arg, defaults, "args");
  moe_ep_dispatch_result_t result{};
  result.struct_size = sizeof(result);
  write_versioned(result_arg, result, "result");  // checks the output struct before any work
  if (h.dispatched) {
    fail(MOE_EP_ERROR_INVALID_STATE,
         "moe_ep_dispatch: expected a combine for the previous dispatch first (one dispatch/combine pair in flight per handle)");
  }
  const DispatchCall call = validate_dispatch(h, args);

  const DispatchBuffers out = h.backend->dispatch(call, stream);
  h.dispatched = true;
  h.last_dispatch = call;
  h.last_had_weights = call.has_weights;

  const Layout& l = h.layout;
  const moe_ep_device_t dev = h.backend->device();
  const int64_t P = l.receive_rows(call.tokens_per_rank);
  result.tokens_per_rank = call.tokens_per_rank;
  result.hidden_states = view(out.hidden, dev, l.hidden_dtype, h.shape_hidden, {P, l.hidden_row_elems});
  result.topk_ids = view(out.topk_ids, dev, dtype_int32(), h.shape_ids, {P, l.top_k});
  result.topk_weights = view(out.topk_weights, dev, dtype_fp32(), h.shape_weights, {P, l.top_k});
  result.hidden_states_scale = view(out.scales, dev, l.scale_dtype, h.shape_scales, {P, l.scale_row_elems});
  result.recv_counts = view(out.recv_counts, dev, dtype_int32(), h.shape_recv_counts, {l.world_size});
  result.local_expert_counts =
      view(out.local_expert_counts, dev, dtype_int32(), h.shape_local_expert_counts, {l.experts_per_rank()});
  result.eplb_gathered_stats = view(out.eplb_gathered, dev, dtype_int32(), h.shape_eplb, {l.world_size, l.num_experts});
  write_versioned(result_arg, result, "result");
}

void combine(moe_ep_handle_s& h, const moe_ep_tensor_t* expert_output, const moe_ep_tensor_t* output,
             moe_ep_combine_result_t* result_arg, void* stream) {
  check_not_broken(h);
  moe_ep_combine_result_t result{};
  result.struct_size = sizeof(result);
  write_versioned(result_arg, result, "result");
  if (!h.dispatched) {
    fail(MOE_EP_ERROR_INVALID_STATE, "moe_ep_combine: expected a dispatch first (combine returns its tokens)");
  }
  const Layout& l = h.layout;
  const moe_ep_device_t dev = h.backend->device();
  const int64_t tpr = h.last_dispatch.tokens_per_rank;
  const int64_t T = h.last_dispatch.num_tokens;
  CombineCall c;
  c.num_tokens = h.last_dispatch.num_tokens;
  c.tokens_per_rank = h.last_dispatch.tokens_per_rank;
  c.expert_output = check_tensor(expert_output, "expert_output", l.combine_dtype,
                                 {{l.world_size * tpr, l.hidden_size}, {l.world_size, tpr, l.hidden_size}}, dev);
  if (output) c.output = check_tensor(output, "output", l.combine_dtype, {{T, l.hidden_size}}, dev);

  void* out = h.backend->combine(c, stream);
  h.dispatched = false;
  result.output = view(out, dev, l.combine_dtype, h.shape_output, {T, l.hidden_size});
  if (result.output.data == nullptr) {  // T == 0 and no buffer: still a well-formed empty view
    h.shape_output[0] = 0;
    h.shape_output[1] = l.hidden_size;
    result.output.device = dev;
    result.output.ndim = 2;
    result.output.dtype = l.combine_dtype;
    result.output.shape = h.shape_output;
  }
  write_versioned(result_arg, result, "result");
}

moe_ep_status_t poll_async_error(moe_ep_handle_s& h) {
  if (h.broken_status != MOE_EP_SUCCESS) {
    set_last_error(h.broken_message);
    return h.broken_status;
  }
  std::string message;
  const moe_ep_status_t s = h.backend->poll_async_error(&message);
  if (s == MOE_EP_ERROR_TIMEOUT || s == MOE_EP_ERROR_CUDA || s == MOE_EP_ERROR_INTERNAL) {
    h.broken_status = s;  // sticky: the group is no longer in step
    h.broken_message = message;
  }
  if (s != MOE_EP_SUCCESS) set_last_error(message);
  return s;
}

void destroy_handle(moe_ep_handle_s* h) noexcept {
  if (h == nullptr) return;
  if (h->backend) h->backend->shutdown();
  delete h;
}

}  // namespace moe_ep
