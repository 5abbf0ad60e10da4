#include "handle.hpp"

#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "collective_step.hpp"
#include "dtype.hpp"
#include "bounded_exchange.hpp"
#include "error.hpp"
#include "host_backend.hpp"
#include "nccl/nccl_backend.hpp"
#include "common/host_identity.hpp"
#include "nvlink/nvlink_backend.hpp"
#include "common/log.hpp"
#include "tensor_check.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

int32_t resolve_backend_locally(const moe_ep_config_t& config) {
  if (config.backend == MOE_EP_BACKEND_HOST) return MOE_EP_BACKEND_HOST;
  if (config.backend == MOE_EP_BACKEND_NCCL) {
    std::string why;
    if (!nccl_platform_supported(config.device, &why)) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NCCL is not usable on device ", config.device,
           " of this process: ", why);
    }
    return MOE_EP_BACKEND_NCCL;
  }
  const bool supported = nvlink_platform_supported(config.device);
  if (config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED && !supported) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on device ",
         config.device, " of this process (no CUDA driver, no GPU, or no backend in this build)");
  }
  if (supported) return MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  return nccl_platform_supported(config.device, nullptr) ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_HOST;
}

namespace {

// The fields every rank must agree on, compared by name after one allgather.
struct GroupFingerprint {
  int32_t num_experts;
  int32_t top_k;
  int32_t max_tokens_per_rank;
  int32_t hidden_size;
  int32_t hidden_dtype;
  int32_t hidden_row_elems;
  int32_t scale_row_elems;
  int32_t scale_dtype;
  int32_t invalid_expert_id;
  int32_t enable_eplb_stats;
  int32_t combine_dtype;
  int32_t backend;
  int32_t world_size;
  int32_t timeout_ms;
  int32_t zero_copy_combine;
};

struct FingerprintField {
  const char* name;
  int32_t GroupFingerprint::*field;
};
constexpr FingerprintField kFingerprintFields[] = {
    {"params->num_experts", &GroupFingerprint::num_experts},
    {"params->top_k", &GroupFingerprint::top_k},
    {"params->max_tokens_per_rank", &GroupFingerprint::max_tokens_per_rank},
    {"params->hidden_size", &GroupFingerprint::hidden_size},
    {"params->hidden_dtype", &GroupFingerprint::hidden_dtype},
    {"params->hidden_row_elems", &GroupFingerprint::hidden_row_elems},
    {"params->scale_row_elems", &GroupFingerprint::scale_row_elems},
    {"params->scale_dtype", &GroupFingerprint::scale_dtype},
    {"params->invalid_expert_id", &GroupFingerprint::invalid_expert_id},
    {"params->enable_eplb_stats", &GroupFingerprint::enable_eplb_stats},
    {"params->combine_dtype", &GroupFingerprint::combine_dtype},
    {"config->backend", &GroupFingerprint::backend},
    {"bootstrap->world_size", &GroupFingerprint::world_size},
    {"config->timeout_ms", &GroupFingerprint::timeout_ms},
    {"config->zero_copy_combine", &GroupFingerprint::zero_copy_combine},
};
static_assert(sizeof(kFingerprintFields) / sizeof(kFingerprintFields[0]) ==
                  sizeof(GroupFingerprint) / sizeof(int32_t),
              "every field of GroupFingerprint is compared");

int32_t pack_dtype(const moe_ep_dtype_t& d) { return d.code | (d.bits << 8) | (d.lanes << 16); }

GroupFingerprint fingerprint(const Layout& l, int32_t backend, int32_t timeout_ms) {
  GroupFingerprint f{};
  f.num_experts = l.num_experts;
  f.top_k = l.top_k;
  f.max_tokens_per_rank = l.max_tokens_per_rank;
  f.hidden_size = l.hidden_size;
  f.hidden_dtype = pack_dtype(l.hidden_dtype);
  f.hidden_row_elems = l.hidden_row_elems;
  f.scale_row_elems = l.scale_row_elems;
  f.scale_dtype = pack_dtype(l.scale_dtype);
  f.invalid_expert_id = l.invalid_expert_id;
  f.enable_eplb_stats = l.eplb_stats ? 1 : 0;
  f.combine_dtype = pack_dtype(l.combine_dtype);
  f.backend = backend;
  f.world_size = l.world_size;
  f.timeout_ms = timeout_ms;
  f.zero_copy_combine = l.zero_copy_combine ? 1 : 0;
  return f;
}

void check_same_on_every_rank(const Exchange& b, const GroupFingerprint& mine) {
  const std::vector<GroupFingerprint> all = b.allgather_value(mine, "create: parameter check");
  for (int32_t r = 0; r < b.world_size(); ++r) {
    for (const FingerprintField& f : kFingerprintFields) {
      if (all[r].*f.field != all[0].*f.field) {
        fail(MOE_EP_ERROR_INVALID_ARGUMENT, f.name, ": expected the same value on every rank, got ", all[0].*f.field,
             " on rank 0 and ", all[r].*f.field, " on rank ", r);
      }
    }
  }
}

// What one rank can run, for AUTO: the NVLink backend, NCCL, and where it is.
struct BackendView {
  int32_t local_choice;  // resolve_backend_locally's answer
  int32_t nccl_usable;
  HostIdentity host;
};

const char* backend_name(int32_t backend) {
  switch (backend) {
    case MOE_EP_BACKEND_NVLINK_TWO_SIDED: return "NVLINK_TWO_SIDED";
    case MOE_EP_BACKEND_NCCL: return "NCCL";
    default: return "HOST";
  }
}

// Collective.  AUTO: NVLINK_TWO_SIDED when every rank supports it and all run
// on one host (one NVLink domain with peer access), else NCCL when it loads on
// every rank with a GPU, else HOST.  Explicit choices were checked locally;
// NVLINK_TWO_SIDED must also hold on every rank.
int32_t agree_on_backend(const Exchange& exchange, int32_t asked, const moe_ep_config_t& config) {
  BackendView mine{};
  mine.local_choice = config.backend;
  mine.nccl_usable = asked == MOE_EP_BACKEND_AUTO && config.backend != MOE_EP_BACKEND_HOST &&
                     (config.backend == MOE_EP_BACKEND_NCCL || nccl_platform_supported(config.device, nullptr));
  mine.host = local_host_identity();
  const std::vector<BackendView> all = exchange.allgather_value(mine, "create: backend choice");
  bool all_nvlink = true, all_nccl = true, one_host = true;
  for (const BackendView& v : all) {
    all_nvlink = all_nvlink && v.local_choice == MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    all_nccl = all_nccl && v.nccl_usable != 0;
    one_host = one_host && same_host(v.host, all[0].host);
  }
  if (asked == MOE_EP_BACKEND_NVLINK_TWO_SIDED && !all_nvlink) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on every rank");
  }
  if (asked != MOE_EP_BACKEND_AUTO) return config.backend;
  const int32_t chosen = all_nvlink && one_host ? MOE_EP_BACKEND_NVLINK_TWO_SIDED
                         : all_nccl             ? MOE_EP_BACKEND_NCCL
                                                : MOE_EP_BACKEND_HOST;
  log_info("rank ", exchange.rank(), ": backend AUTO chose ", backend_name(chosen), " (every rank NVLink-capable: ",
           all_nvlink ? "yes" : "no", ", one host: ", one_host ? "yes" : "no", ", NCCL usable on every rank: ",
           all_nccl ? "yes" : "no", ")");
  return chosen;
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
  run_then_agree(*exchange, [&] { backend = make_host_backend(layout, exchange); });
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
  run_then_agree(*exchange, [&] {
    const moe_ep_params_t params = read_params(params_arg);
    handle->config = read_config(config_arg);
    handle->layout = make_layout(params, bootstrap.world_size(), bootstrap.rank());
    handle->layout.zero_copy_combine = handle->config.zero_copy_combine != 0;
    handle->config.backend = resolve_backend_locally(handle->config);
    mine = fingerprint(handle->layout, handle->config.backend, handle->config.timeout_ms);
  });

  // AUTO may resolve differently per rank (one rank without a GPU, ranks on
  // several hosts): the group agrees on one backend from every rank's view.
  const int32_t asked = config_arg ? read_config(config_arg).backend : MOE_EP_BACKEND_AUTO;
  handle->config.backend = agree_on_backend(*exchange, asked, handle->config);
  mine.backend = handle->config.backend;
  check_same_on_every_rank(*exchange, mine);

  if (handle->config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED) {
    exchange.reset();  // idle: its worker is joined; the NVLink backend bounds its own waits
    handle->backend = make_nvlink_backend(handle->layout, handle->config, bootstrap);
  } else if (handle->config.backend == MOE_EP_BACKEND_NCCL) {
    exchange.reset();  // idle: its worker is joined; the NCCL backend bounds its own waits
    handle->backend = make_nccl_backend(handle->layout, handle->config, bootstrap);
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

// A result view of the handle's memory; absent (data NULL, ndim 0) when data
// is NULL, unless `even_empty`: then a well-formed view with data NULL (a
// tensor with no elements has no address).
moe_ep_tensor_t view(void* data, const moe_ep_device_t& dev, const moe_ep_dtype_t& dtype,
                     int64_t* shape_storage, std::initializer_list<int64_t> shape, bool even_empty = false) {
  moe_ep_tensor_t t{};
  if (data == nullptr && !even_empty) return t;
  int i = 0;
  for (int64_t d : shape) shape_storage[i++] = d;
  t.data = data;
  t.device = dev;
  t.ndim = i;
  t.dtype = dtype;
  t.shape = shape_storage;
  return t;
}

// The address a tensor's elements start at (data + byte_offset), 0 for none.
uintptr_t tensor_address(const moe_ep_tensor_t* t) {
  if (t == nullptr || t->data == nullptr) return 0;
  return reinterpret_cast<uintptr_t>(t->data) + static_cast<uintptr_t>(t->byte_offset);
}

// An expert_output that starts at the combine_input view must have the shape of
// the matching dispatch; the usual shape message would not say why (typically a
// view kept from an earlier dispatch with another tokens_per_rank).
void check_zero_copy_shape(const moe_ep_handle_s& h, const moe_ep_tensor_t* expert_output) {
  if (h.combine_input == nullptr || tensor_address(expert_output) != reinterpret_cast<uintptr_t>(h.combine_input)) {
    return;
  }
  const Layout& l = h.layout;
  const int64_t tpr = h.last_dispatch.tokens_per_rank;
  const std::vector<int64_t> shape = tensor_shape(*expert_output, "expert_output");
  const bool flat = shape == std::vector<int64_t>{l.world_size * tpr, l.hidden_size};
  const bool split = shape == std::vector<int64_t>{l.world_size, tpr, l.hidden_size};
  if (!flat && !split) {
    fail(MOE_EP_ERROR_INVALID_ARGUMENT, "expert_output: starts at the combine_input view, so expected the shape of ",
         "the matching dispatch (tokens_per_rank ", tpr, "): ", shape_string({l.world_size * tpr, l.hidden_size}),
         " or ", shape_string({l.world_size, tpr, l.hidden_size}), ", got ", shape_string(shape),
         " (a combine_input view kept from an earlier dispatch?)");
  }
}

// Whether the validated expert_output (`data`, receive_rows(tpr) rows) is the
// combine_input view of the matching dispatch.  A tensor that overlaps the
// region without starting at it is refused: a backend reading the region in
// place could not tell which rows the caller meant.
bool is_combine_input_view(const moe_ep_handle_s& h, const void* data, int64_t tpr) {
  if (h.combine_input == nullptr || data == nullptr) return false;
  const Layout& l = h.layout;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t region = reinterpret_cast<uintptr_t>(h.combine_input);
  if (begin == region) return true;
  const uint64_t bytes = static_cast<uint64_t>(l.receive_rows(static_cast<int32_t>(tpr))) * l.combine_row_bytes;
  const uint64_t region_bytes = combine_input_region_bytes(l);  // sizes were checked at create
  const bool overlaps = begin < region ? region - begin < bytes : begin - region < region_bytes;
  if (overlaps) {
    fail(MOE_EP_ERROR_INVALID_ARGUMENT, "expert_output: overlaps the combine_input view (", region_bytes, " bytes at ",
         h.combine_input, ") without starting at it (starts ", begin < region ? "before" : "inside", " it, at ", data,
         "); pass the combine_input view itself or a tensor outside it");
  }
  return false;
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
  result.combine_input = view(out.combine_input, dev, l.combine_dtype, h.shape_combine_input, {P, l.hidden_size});
  h.combine_input = out.combine_input;
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
  check_zero_copy_shape(h, expert_output);
  c.expert_output = check_tensor(expert_output, "expert_output", l.combine_dtype,
                                 {{l.world_size * tpr, l.hidden_size}, {l.world_size, tpr, l.hidden_size}}, dev);
  c.expert_output_is_workspace = is_combine_input_view(h, c.expert_output, tpr);
  if (output) c.output = check_tensor(output, "output", l.combine_dtype, {{T, l.hidden_size}}, dev);

  void* out = h.backend->combine(c, stream);
  h.dispatched = false;
  result.output = view(out, dev, l.combine_dtype, h.shape_output, {T, l.hidden_size}, /*even_empty=*/true);
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
