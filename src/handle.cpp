#include "handle.hpp"

#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "backend_table.hpp"
#include "bounded_exchange.hpp"
#include "collective_step.hpp"
#include "common/tuning_registry.hpp"
#include "dtype.hpp"
#include "error.hpp"
#include "handle_failure.hpp"
#include "tensor_check.hpp"
#include "versioned_struct.hpp"

namespace moe_ep {

namespace {

int32_t pack_dtype(const moe_ep_dtype_t& d) { return d.code | (d.bits << 8) | (d.lanes << 16); }

// The fields every rank must agree on, compared by name after one allgather.
std::vector<RankValue> fingerprint_of(const Layout& l, int32_t backend, int32_t timeout_ms, int32_t micro_batches) {
  return {
      {"params->num_experts", l.num_experts},
      {"params->top_k", l.top_k},
      {"params->max_tokens_per_rank", l.max_tokens_per_rank},
      {"params->hidden_size", l.hidden_size},
      {"params->hidden_dtype", pack_dtype(l.hidden_dtype)},
      {"params->hidden_row_elems", l.hidden_row_elems},
      {"params->scale_row_elems", l.scale_row_elems},
      {"params->scale_dtype", pack_dtype(l.scale_dtype)},
      {"params->invalid_expert_id", l.invalid_expert_id},
      {"params->enable_eplb_stats", l.eplb_stats ? 1 : 0},
      {"params->combine_dtype", pack_dtype(l.combine_dtype)},
      {"params->receive_layout", l.receive_layout},
      {"params->expert_capacity", l.expert_capacity},
      {"params->expert_alignment", l.expert_alignment},
      {"params->expert_rows", l.expert_rows},
      {"params->expert_output_weighted", l.expert_output_weighted ? 1 : 0},
      {"params->scale_layout", l.scale_layout},
      {"params->dispatch_wire", l.dispatch_wire},
      {"params->combine_wire", l.combine_wire},
      {"params->wire_scale", l.wire_scale},
      {"params->dispatch_dequantize", l.dispatch_dequantize ? 1 : 0},
      {"config->backend", backend},
      {"bootstrap->world_size", l.world_size},
      {"config->timeout_ms", timeout_ms},
      {"config->zero_copy_combine", l.zero_copy_combine ? 1 : 0},
      {"config->micro_batches", micro_batches},
  };
}

// A string as one int32 for the fingerprint (FNV-1a, folded).
int32_t text_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return static_cast<int32_t>(static_cast<uint32_t>(h ^ (h >> 32)));
}

// Whether the caller asked for a rejoin (a config this rank cannot read is
// reported by the ordinary create's agreement instead).
bool rejoin_requested(const moe_ep_config_t* config_arg) {
  try {
    return config_arg != nullptr && read_config(config_arg).rejoin != 0;
  } catch (const Error&) {
    return false;
  }
}

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

}  // namespace

bool is_platform_supported(int32_t device) {
  return backend_entry(MOE_EP_BACKEND_NVLINK_TWO_SIDED).platform_supported(device, nullptr);
}

uint64_t workspace_size(const moe_ep_params_t* params_arg, const moe_ep_config_t* config_arg, int32_t world_size) {
  if (world_size <= 0) fail_argument("world_size", "> 0", world_size);
  const moe_ep_params_t params = read_params(params_arg);
  const moe_ep_config_t config = read_config(config_arg);
  Layout layout = make_layout(params, world_size, 0);
  layout.zero_copy_combine = config.zero_copy_combine != 0;
  const int32_t backend = resolve_backend_locally(config);
  check_backend_capabilities(backend, layout, config.micro_batches);
  return backend_entry(backend).workspace_bytes(layout, config);
}

moe_ep_handle_s* create_handle(const moe_ep_bootstrap_t* bootstrap_arg, const moe_ep_params_t* params_arg,
                               const moe_ep_config_t* config_arg) {
  if (rejoin_requested(config_arg)) return create_rejoining_handle(bootstrap_arg, params_arg, config_arg);
  // Without a usable bootstrap there is no way to tell the peers: fail locally.
  const Bootstrap bootstrap(bootstrap_arg);
  // Every wait for a peer below is bounded by this rank's timeout_ms.
  auto exchange = std::make_shared<BoundedExchange>(bootstrap, local_timeout_ms(config_arg));

  // Local validation; its outcome is shared so that no rank waits for a rank that gave up.
  auto handle = std::make_unique<moe_ep_handle_s>();
  FailureConfig failure;
  run_then_agree(*exchange, [&] {
    validate_tuning_environment(bootstrap.rank());  // every MOE_EP_* knob, before anything is allocated
    const moe_ep_params_t params = read_params(params_arg);
    handle->config = read_config(config_arg);
    failure = read_failure_config(handle->config);
    handle->store_address = failure.store_address;
    handle->store_prefix = failure.store_prefix;
    handle->config.store_address = nullptr;  // the caller's strings are not kept
    handle->config.store_prefix = nullptr;
    handle->layout = make_layout(params, bootstrap.world_size(), bootstrap.rank());
    handle->layout.zero_copy_combine = handle->config.zero_copy_combine != 0;
    handle->config.backend = resolve_backend_locally(handle->config);
  });

  // AUTO may resolve differently per rank (one rank without a GPU, ranks on
  // several hosts): the group agrees on one backend from every rank's view.
  const int32_t asked = config_arg ? read_config(config_arg).backend : MOE_EP_BACKEND_AUTO;
  handle->config.backend = agree_on_backend(*exchange, asked, handle->config);
  check_same_on_every_rank(*exchange, group_fingerprint(*handle), "create: parameter check");
  // Beyond what the backend implements: UNSUPPORTED, the same answer on every
  // rank once the backend and the parameters are agreed.
  check_backend_capabilities(handle->config.backend, handle->layout, handle->config.micro_batches);
  handle->slots.resize(static_cast<size_t>(handle->config.micro_batches));
  handle->active.assign(static_cast<size_t>(handle->layout.world_size), 1);

  if (failure.policy == MOE_EP_ON_FAILURE_MASK) {
    handle->backend = make_masking_backend(bootstrap, *exchange, *handle, failure, group_fingerprint(*handle));
    return handle.release();
  }
  handle->backend =
      backend_entry(handle->config.backend).create(handle->layout, handle->config, bootstrap, std::move(exchange));
  return handle.release();
}

std::vector<RankValue> group_fingerprint(const moe_ep_handle_s& h) {
  std::vector<RankValue> values =
      fingerprint_of(h.layout, h.config.backend, h.config.timeout_ms, h.config.micro_batches);
  values.push_back({"config->failure_policy", h.config.failure_policy});
  values.push_back({"config->store_prefix (its hash)", text_hash(h.store_prefix)});
  return values;
}

namespace {

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

// An expert_output that starts at the slot's combine_input view must have the
// shape of the matching dispatch; the usual shape message would not say why
// (typically a view kept from an earlier dispatch with another tokens_per_rank).
void check_zero_copy_shape(const moe_ep_handle_s& h, const PairSlot& slot, const moe_ep_tensor_t* expert_output) {
  if (slot.combine_input == nullptr ||
      tensor_address(expert_output) != reinterpret_cast<uintptr_t>(slot.combine_input)) {
    return;
  }
  const Layout& l = h.layout;
  const int64_t tpr = slot.dispatch.tokens_per_rank;
  if (l.expert_layout()) return;  // its shapes do not depend on the dispatch: validate_combine checks them
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
// slot's combine_input view of the matching dispatch.  A tensor that overlaps
// the region without starting at it is refused: a backend reading the region
// in place could not tell which rows the caller meant.
bool is_combine_input_view(const moe_ep_handle_s& h, const PairSlot& slot, const void* data, int64_t tpr) {
  if (slot.combine_input == nullptr || data == nullptr) return false;
  const Layout& l = h.layout;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t region = reinterpret_cast<uintptr_t>(slot.combine_input);
  if (begin == region) return true;
  const uint64_t bytes = static_cast<uint64_t>(l.combine_rows(static_cast<int32_t>(tpr))) * l.combine_row_bytes;
  const uint64_t region_bytes = combine_input_region_bytes(l);  // sizes were checked at create
  const bool overlaps = begin < region ? region - begin < bytes : begin - region < region_bytes;
  if (overlaps) {
    fail(MOE_EP_ERROR_INVALID_ARGUMENT, "expert_output: overlaps the combine_input view (", region_bytes, " bytes at ",
         slot.combine_input, ") without starting at it (starts ", begin < region ? "before" : "inside", " it, at ",
         data, "); pass the combine_input view itself or a tensor outside it");
  }
  return false;
}

// ---- The in-flight rules (docs/overlap.md): one state machine per slot ----

const char* state_name(SlotState s) {
  switch (s) {
    case SlotState::idle: return "IDLE";
    case SlotState::dispatch_sent: return "DISPATCH_SENT";
    case SlotState::dispatched: return "DISPATCHED";
    case SlotState::combine_sent: return "COMBINE_SENT";
  }
  return "?";
}

// What a slot in state `s` waits for: the call that would be valid on it.
const char* state_advice(SlotState s) {
  switch (s) {
    case SlotState::idle:
      return "no pair in flight on it: expected a dispatch first (moe_ep_dispatch_send or moe_ep_dispatch)";
    case SlotState::dispatch_sent: return "its dispatch is in flight: expected moe_ep_dispatch_recv on it first";
    case SlotState::dispatched:
      return "its dispatch results are live: expected a combine for the previous dispatch first "
             "(moe_ep_combine_send or moe_ep_combine)";
    case SlotState::combine_sent: return "its combine is in flight: expected moe_ep_combine_recv on it first";
  }
  return "?";
}

// The slot a call names; the range is an argument rule, whatever the states.
PairSlot& slot_of(moe_ep_handle_s& h, const char* call, int32_t slot) {
  const int32_t n = static_cast<int32_t>(h.slots.size());
  if (slot < 0 || slot >= n) {
    fail_argument(std::string(call) + ": slot",
                  "in [0, " + std::to_string(n) + ") (config->micro_batches = " + std::to_string(n) + ")", slot);
  }
  return h.slots[static_cast<size_t>(slot)];
}

// INVALID_STATE unless the slot is in `expected`; nothing has been done yet.
void expect_state(const moe_ep_handle_s& h, const char* call, int32_t slot, SlotState expected) {
  const SlotState got = h.slots[static_cast<size_t>(slot)].state;
  if (got == expected) return;
  size_t busy = 0;
  for (const PairSlot& s : h.slots) busy += s.state != SlotState::idle ? 1 : 0;
  const bool all_busy = h.slots.size() > 1 && busy == h.slots.size();
  fail(MOE_EP_ERROR_INVALID_STATE, call, "(slot ", slot, "): expected slot ", slot, " in state ", state_name(expected),
       ", got ", state_name(got), " (", state_advice(got), ")",
       all_busy ? "; config->micro_batches = " + std::to_string(h.slots.size()) + " pairs in flight, no slot is free"
                : std::string(),
       "; nothing was done, the handle stays usable");
}

// The split calls exist only where the backend implements them: never a fused
// call in the send half.
void require_split(const moe_ep_handle_s& h, const char* call, const char* fused) {
  if (!h.backend->split_phases()) {
    fail(MOE_EP_ERROR_UNSUPPORTED, call, ": the ", backend_entry(h.config.backend).name,
         " backend has no split phases; use ", fused);
  }
}

// ---- The halves, once the state and the arguments are checked ----

// The slot holds the dispatch's sizes, not the caller's memory.
void keep_dispatch(PairSlot& s, const DispatchCall& call) {
  s.dispatch = call;
  s.dispatch.hidden = nullptr;
  s.dispatch.topk_ids = nullptr;
  s.dispatch.topk_weights = nullptr;
  s.dispatch.scales = nullptr;
  s.dispatch.eplb_local = nullptr;
}

void send_dispatch(moe_ep_handle_s& h, int32_t slot, const DispatchCall& call, void* stream) {
  h.backend->dispatch_send(slot, call, stream);
  PairSlot& s = h.slots[static_cast<size_t>(slot)];
  s.state = SlotState::dispatch_sent;
  keep_dispatch(s, call);
}

// The views of an expert layout (docs/semantics.md, "Receive layouts"): the
// payload, scales and zero-copy input in expert rows, the rows' sources and
// weights, the per-expert counts and offsets; no topk_ids or topk_weights.
void write_expert_layout_views(const Layout& l, const moe_ep_device_t& dev, PairSlot& s, const DispatchBuffers& out,
                               moe_ep_dispatch_result_t& result) {
  const int64_t E = l.experts_per_rank(), rows = l.expert_layout_rows(), S = l.scale_row_elems;
  const bool major = l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR;
  const int64_t cap = l.expert_capacity;
  result.topk_ids = moe_ep_tensor_t{};
  result.topk_weights = moe_ep_tensor_t{};
  result.hidden_states = major ? view(out.hidden, dev, l.hidden_dtype, s.shape_hidden, {E, cap, l.hidden_row_elems})
                               : view(out.hidden, dev, l.hidden_dtype, s.shape_hidden, {rows, l.hidden_row_elems});
  if (l.scale_layout == MOE_EP_SCALES_COLUMN_MAJOR) {
    result.hidden_states_scale =
        major ? view(out.scales, dev, l.scale_dtype, s.shape_scales, {E, S, scale_column_rows(cap)})
              : view(out.scales, dev, l.scale_dtype, s.shape_scales, {S, scale_column_rows(rows)});
  } else {
    result.hidden_states_scale = major ? view(out.scales, dev, l.scale_dtype, s.shape_scales, {E, cap, S})
                                       : view(out.scales, dev, l.scale_dtype, s.shape_scales, {rows, S});
  }
  result.combine_input =
      major ? view(out.combine_input, dev, l.combine_dtype, s.shape_combine_input, {E, cap, l.hidden_size})
            : view(out.combine_input, dev, l.combine_dtype, s.shape_combine_input, {rows, l.hidden_size});
  result.expert_counts = view(out.expert_counts, dev, dtype_int32(), s.shape_expert_counts, {E});
  result.expert_offsets = view(out.expert_offsets, dev, dtype_int32(), s.shape_expert_offsets, {E + 1});
  result.row_sources = view(out.row_sources, dev, dtype_int32(), s.shape_row_sources, {rows, 3});
  result.row_weights = view(out.row_weights, dev, dtype_fp32(), s.shape_row_weights, {rows});
  result.dropped_pairs = view(out.dropped_pairs, dev, dtype_int32(), s.shape_dropped_pairs, {1});
}

// The slot's results as views, written to the caller's struct.
void write_dispatch_result(moe_ep_handle_s& h, PairSlot& s, const DispatchBuffers& out,
                           moe_ep_dispatch_result_t* result_arg) {
  const Layout l = received_layout(h.layout);  // an FP8 wire's rows and scales, or the caller's dtype
  const moe_ep_device_t dev = h.backend->device();
  const int64_t P = l.receive_rows(s.dispatch.tokens_per_rank);
  moe_ep_dispatch_result_t result{};
  result.struct_size = sizeof(result);
  result.tokens_per_rank = s.dispatch.tokens_per_rank;
  result.hidden_states = view(out.hidden, dev, l.hidden_dtype, s.shape_hidden, {P, l.hidden_row_elems});
  result.topk_ids = view(out.topk_ids, dev, dtype_int32(), s.shape_ids, {P, l.top_k});
  result.topk_weights = view(out.topk_weights, dev, dtype_fp32(), s.shape_weights, {P, l.top_k});
  result.hidden_states_scale = view(out.scales, dev, l.scale_dtype, s.shape_scales, {P, l.scale_row_elems});
  result.recv_counts = view(out.recv_counts, dev, dtype_int32(), s.shape_recv_counts, {l.world_size});
  result.local_expert_counts =
      view(out.local_expert_counts, dev, dtype_int32(), s.shape_local_expert_counts, {l.experts_per_rank()});
  result.eplb_gathered_stats = view(out.eplb_gathered, dev, dtype_int32(), s.shape_eplb, {l.world_size, l.num_experts});
  result.combine_input = view(out.combine_input, dev, l.combine_dtype, s.shape_combine_input, {P, l.hidden_size});
  if (l.expert_layout()) write_expert_layout_views(l, dev, s, out, result);
  s.combine_input = out.combine_input;
  write_versioned(result_arg, result, "result");
}

// A receive half that fails ends its pair: the slot is free again (every rank
// checked the same data, so every rank's slot is).
template <typename Recv>
auto receive_or_end_pair(PairSlot& s, Recv&& recv) -> decltype(recv()) {
  try {
    return recv();
  } catch (...) {
    s.state = SlotState::idle;
    throw;
  }
}

void recv_dispatch(moe_ep_handle_s& h, int32_t slot, moe_ep_dispatch_result_t* result_arg, void* stream) {
  PairSlot& s = h.slots[static_cast<size_t>(slot)];
  const DispatchBuffers out = receive_or_end_pair(s, [&] { return h.backend->dispatch_recv(slot, stream); });
  s.state = SlotState::dispatched;
  write_dispatch_result(h, s, out, result_arg);
}

// expert_output checked against the slot's dispatch.
CombineCall validate_combine(const moe_ep_handle_s& h, const PairSlot& s, const moe_ep_tensor_t* expert_output) {
  const Layout& l = h.layout;
  const int64_t tpr = s.dispatch.tokens_per_rank;
  CombineCall c;
  c.num_tokens = s.dispatch.num_tokens;
  c.tokens_per_rank = s.dispatch.tokens_per_rank;
  check_zero_copy_shape(h, s, expert_output);
  if (l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) {
    const int64_t E = l.experts_per_rank(), cap = l.expert_capacity;
    c.expert_output = check_tensor(expert_output, "expert_output", l.combine_dtype,
                                   {{E, cap, l.hidden_size}, {E * cap, l.hidden_size}}, h.backend->device());
  } else if (l.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED) {
    c.expert_output = check_tensor(expert_output, "expert_output", l.combine_dtype,
                                   {{int64_t{l.expert_rows}, l.hidden_size}}, h.backend->device());
  } else {
    c.expert_output =
        check_tensor(expert_output, "expert_output", l.combine_dtype,
                     {{l.world_size * tpr, l.hidden_size}, {l.world_size, tpr, l.hidden_size}}, h.backend->device());
  }
  c.expert_output_is_workspace = is_combine_input_view(h, s, c.expert_output, tpr);
  return c;
}

void* validate_output(const moe_ep_handle_s& h, const PairSlot& s, const moe_ep_tensor_t* output) {
  if (output == nullptr) return nullptr;
  const Layout& l = h.layout;
  return check_tensor(output, "output", l.combine_dtype, {{int64_t{s.dispatch.num_tokens}, l.hidden_size}},
                      h.backend->device());
}

void write_combine_result(moe_ep_handle_s& h, PairSlot& s, void* out, moe_ep_combine_result_t* result_arg) {
  const Layout& l = h.layout;
  moe_ep_combine_result_t result{};
  result.struct_size = sizeof(result);
  result.output = view(out, h.backend->device(), l.combine_dtype, s.shape_output,
                       {int64_t{s.dispatch.num_tokens}, l.hidden_size}, /*even_empty=*/true);
  write_versioned(result_arg, result, "result");
}

void* recv_combine(moe_ep_handle_s& h, int32_t slot, void* output, void* stream) {
  PairSlot& s = h.slots[static_cast<size_t>(slot)];
  void* out = receive_or_end_pair(s, [&] { return h.backend->combine_recv(slot, output, stream); });
  s.state = SlotState::idle;
  return out;
}

moe_ep_dispatch_args_t read_args(const moe_ep_dispatch_args_t* args_arg) {
  moe_ep_dispatch_args_t defaults{};
  defaults.struct_size = sizeof(defaults);
  return read_versioned(args_arg, defaults, "args");
}

// Checks the caller's output struct before any work.
template <typename Result>
void check_result_struct(Result* result_arg) {
  Result result{};
  result.struct_size = sizeof(result);
  write_versioned(result_arg, result, "result");
}

// ---- The calls: the fused ones are the two halves on slot 0 ----

void run_dispatch(moe_ep_handle_s& h, const moe_ep_dispatch_args_t* args_arg, moe_ep_dispatch_result_t* result_arg,
                  void* stream) {
  const moe_ep_dispatch_args_t args = read_args(args_arg);
  check_result_struct(result_arg);
  expect_state(h, "moe_ep_dispatch", 0, SlotState::idle);
  const DispatchCall call = validate_dispatch(h, args);
  if (h.backend->split_phases() && !h.backend->fused_calls_are_faster()) {
    send_dispatch(h, 0, call, stream);
    recv_dispatch(h, 0, result_arg, stream);
    return;
  }
  const DispatchBuffers out = h.backend->dispatch(call, stream);  // a backend with the fused call only
  PairSlot& s = h.slots[0];
  keep_dispatch(s, call);
  s.state = SlotState::dispatched;
  write_dispatch_result(h, s, out, result_arg);
}

void run_combine(moe_ep_handle_s& h, const moe_ep_tensor_t* expert_output, const moe_ep_tensor_t* output,
                 moe_ep_combine_result_t* result_arg, void* stream) {
  check_result_struct(result_arg);
  expect_state(h, "moe_ep_combine", 0, SlotState::dispatched);
  PairSlot& s = h.slots[0];
  CombineCall call = validate_combine(h, s, expert_output);
  call.output = validate_output(h, s, output);
  void* out = nullptr;
  if (h.backend->split_phases() && !h.backend->fused_calls_are_faster()) {
    h.backend->combine_send(0, call, stream);
    s.state = SlotState::combine_sent;
    out = recv_combine(h, 0, call.output, stream);
  } else {
    out = h.backend->combine(call, stream);  // a backend with the fused call only
    s.state = SlotState::idle;
  }
  write_combine_result(h, s, out, result_arg);
}

void run_dispatch_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_dispatch_args_t* args_arg, void* stream) {
  require_split(h, "moe_ep_dispatch_send", "moe_ep_dispatch");
  slot_of(h, "moe_ep_dispatch_send", slot);
  const moe_ep_dispatch_args_t args = read_args(args_arg);
  expect_state(h, "moe_ep_dispatch_send", slot, SlotState::idle);
  send_dispatch(h, slot, validate_dispatch(h, args), stream);
}

void run_dispatch_recv(moe_ep_handle_s& h, int32_t slot, moe_ep_dispatch_result_t* result_arg, void* stream) {
  require_split(h, "moe_ep_dispatch_recv", "moe_ep_dispatch");
  slot_of(h, "moe_ep_dispatch_recv", slot);
  check_result_struct(result_arg);
  expect_state(h, "moe_ep_dispatch_recv", slot, SlotState::dispatch_sent);
  recv_dispatch(h, slot, result_arg, stream);
}

void run_combine_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* expert_output, void* stream) {
  require_split(h, "moe_ep_combine_send", "moe_ep_combine");
  PairSlot& s = slot_of(h, "moe_ep_combine_send", slot);
  expect_state(h, "moe_ep_combine_send", slot, SlotState::dispatched);
  h.backend->combine_send(slot, validate_combine(h, s, expert_output), stream);
  s.state = SlotState::combine_sent;
}

void run_combine_recv(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* output,
                      moe_ep_combine_result_t* result_arg, void* stream) {
  require_split(h, "moe_ep_combine_recv", "moe_ep_combine");
  PairSlot& s = slot_of(h, "moe_ep_combine_recv", slot);
  check_result_struct(result_arg);
  expect_state(h, "moe_ep_combine_recv", slot, SlotState::combine_sent);
  void* out = recv_combine(h, slot, validate_output(h, s, output), stream);
  write_combine_result(h, s, out, result_arg);
}

}  // namespace

void dispatch(moe_ep_handle_s& h, const moe_ep_dispatch_args_t* args, moe_ep_dispatch_result_t* result, void* stream) {
  h.health.guard([&] { survive(h, [&] { run_dispatch(h, args, result, stream); }); });
}

void combine(moe_ep_handle_s& h, const moe_ep_tensor_t* expert_output, const moe_ep_tensor_t* output,
             moe_ep_combine_result_t* result, void* stream) {
  h.health.guard([&] { survive(h, [&] { run_combine(h, expert_output, output, result, stream); }); });
}

void dispatch_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_dispatch_args_t* args, void* stream) {
  h.health.guard([&] { survive(h, [&] { run_dispatch_send(h, slot, args, stream); }); });
}

void dispatch_recv(moe_ep_handle_s& h, int32_t slot, moe_ep_dispatch_result_t* result, void* stream) {
  h.health.guard([&] { survive(h, [&] { run_dispatch_recv(h, slot, result, stream); }); });
}

void combine_send(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* expert_output, void* stream) {
  h.health.guard([&] { survive(h, [&] { run_combine_send(h, slot, expert_output, stream); }); });
}

void combine_recv(moe_ep_handle_s& h, int32_t slot, const moe_ep_tensor_t* output, moe_ep_combine_result_t* result,
                  void* stream) {
  h.health.guard([&] { survive(h, [&] { run_combine_recv(h, slot, output, result, stream); }); });
}

// The error is the query's answer, not its failure: a broken handle answers
// with the failure that broke it, and a sticky error found now breaks it.
moe_ep_status_t poll_async_error(moe_ep_handle_s& h) {
  if (h.health.broken()) {
    set_last_error(h.health.message());
    return h.health.status();
  }
  std::string message;
  const moe_ep_status_t s = h.backend->poll_async_error(&message);
  h.health.record(s, message);
  if (s != MOE_EP_SUCCESS) set_last_error(message);
  return s;
}

int32_t backend_of(const moe_ep_handle_s& h) { return h.config.backend; }

// Only what the host already holds: the handle's sticky state and the
// backend's host-visible device state (a host-mapped word), nothing that waits.
moe_ep_health_t poll_health(moe_ep_handle_s& h) {
  moe_ep_health_t out{};
  out.struct_size = sizeof(out);
  HostHealth seen;
  if (!h.health.broken()) {
    seen = h.backend->host_health();
    if (seen.status != MOE_EP_SUCCESS && !seen.recoverable)
      h.health.record(seen.status, seen.message, seen.failed_rank);
  }
  out.status = h.health.status();
  out.failed_rank = h.health.broken() ? h.health.failed_rank() : h.last_failed_rank;
  if (!h.health.broken() && seen.status != MOE_EP_SUCCESS) {  // found, and the next call recovers from it
    out.status = seen.status;
    out.failed_rank = seen.failed_rank;
    set_last_error(seen.message);
  }
  int32_t count = 0;
  for (uint8_t a : h.active) count += a ? 1 : 0;
  out.active_count = count;
  out.mask_epoch = h.mask_epoch;
  if (h.health.broken()) set_last_error(h.health.message());
  return out;
}

namespace {

void check_mask_size(const moe_ep_handle_s& h, const char* call, const void* active, int32_t world_size) {
  if (active == nullptr) fail_argument(std::string(call) + ": active", "a non-NULL pointer", "NULL");
  if (world_size != h.layout.world_size) {
    fail_argument(std::string(call) + ": world_size", "the handle's world_size " + std::to_string(h.layout.world_size),
                  world_size);
  }
}

// This rank's half of moe_ep_set_active_ranks, before anything is exchanged.
std::vector<uint8_t> local_mask(const moe_ep_handle_s& h, const uint8_t* active, int32_t world_size) {
  constexpr const char* call = "moe_ep_set_active_ranks";
  check_mask_size(h, call, active, world_size);
  std::vector<uint8_t> mask(static_cast<size_t>(world_size));
  int32_t count = 0;
  for (int32_t r = 0; r < world_size; ++r) {
    mask[static_cast<size_t>(r)] = active[r] ? 1 : 0;
    count += mask[static_cast<size_t>(r)];
  }
  if (count == 0) fail_argument(std::string(call) + ": active", "at least one rank active", "every rank inactive");
  for (size_t i = 0; i < h.slots.size(); ++i) {
    const SlotState st = h.slots[i].state;
    if (st != SlotState::idle) {
      fail(MOE_EP_ERROR_INVALID_STATE, call, ": expected every slot IDLE (a mask changes between pairs, from the ",
           "next dispatch on), got slot ", i, " in state ", state_name(st), " (", state_advice(st),
           "); nothing was done, the handle stays usable");
    }
  }
  return mask;
}

}  // namespace

void get_active_ranks(const moe_ep_handle_s& h, uint8_t* active, int32_t world_size) {
  check_mask_size(h, "moe_ep_get_active_ranks", active, world_size);
  std::memcpy(active, h.active.data(), h.active.size());
}

void set_active_ranks(moe_ep_handle_s& h, const uint8_t* active, int32_t world_size) {
  h.health.guard([&] {
    std::vector<uint8_t> mask(h.active.size(), 1);
    moe_ep_status_t local = MOE_EP_SUCCESS;
    std::string message;
    try {
      mask = local_mask(h, active, world_size);
    } catch (...) {
      local = status_of_current_exception(&message);
    }
    if (h.mask_state) {  // failure_policy MASK: the backend's outcome (a failure may change it)
      survive(h, [&] { h.backend->set_active_ranks(mask, local, message); });
      sync_mask(h);
      return;
    }
    h.backend->set_active_ranks(mask, local, message);  // agreed over the group: fails on every rank or none
    h.active = std::move(mask);
    ++h.mask_epoch;
  });
}

// Backends without masks: a local refusal as it is, the all-active mask
// accepted (nothing changes), any other UNSUPPORTED.
void Backend::set_active_ranks(const std::vector<uint8_t>& active, moe_ep_status_t local_status,
                               const std::string& local_message) {
  if (local_status != MOE_EP_SUCCESS) throw Error(local_status, local_message);
  for (size_t r = 0; r < active.size(); ++r) {
    if (!active[r]) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "moe_ep_set_active_ranks: the ", name(),
           " backend has no active-rank mask yet (only the all-active mask); got rank ", r, " inactive");
    }
  }
}

int32_t last_path_of(const moe_ep_handle_s& h, int32_t phase) { return h.backend->paths.last(phase); }

void destroy_handle(moe_ep_handle_s* h) noexcept {
  if (h == nullptr) return;
  if (h->backend) h->backend->shutdown();
  delete h;
}

}  // namespace moe_ep
