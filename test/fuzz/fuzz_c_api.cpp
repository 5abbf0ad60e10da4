// libFuzzer target: drives the public C API on the HOST backend with
// arbitrary struct sizes (the init functions' too), parameters, shapes, dtypes, strides, byte offsets
// and call orders, on a 1-rank group whose bootstrap may also hand back
// arbitrary bytes (a hostile peer).  Built by -DMOE_EP_BUILD_FUZZER=ON with
// clang and the sanitizers; any crash or sanitizer report is a bug.
//
// The only thing the fuzzer must not do is lie about memory: every tensor it
// describes points into a buffer large enough for any shape the library could
// accept for it, and byte offsets are either inside the buffer's slack or so
// large that data + byte_offset wraps (which the library must reject).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "moe_ep_c.h"

namespace {

constexpr size_t kSlack = 64;
constexpr uint64_t kMaxWorkspace = 8u << 20;  // create only what is quick to allocate

// An init with any size writes nothing past it, and nothing at all when it
// refuses the size; a size above the 1024-byte cap is always refused.
template <typename T>
void check_init_within(moe_ep_status_t (*init)(T*, size_t), size_t size) {
  alignas(16) unsigned char buf[1024 + kSlack];
  std::memset(buf, 0xA5, sizeof(buf));
  const moe_ep_status_t s = init(reinterpret_cast<T*>(buf), size);
  if (s == MOE_EP_SUCCESS && size > 1024) __builtin_trap();
  for (size_t i = s == MOE_EP_SUCCESS ? size : 0; i < sizeof(buf); ++i) {
    if (buf[i] != 0xA5) __builtin_trap();
  }
}

void check_inits(FuzzedDataProvider& in) {
  const size_t size =
      in.ConsumeBool() ? in.ConsumeIntegralInRange<size_t>(0, 1024 + kSlack) : in.ConsumeIntegral<size_t>();
  switch (in.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: check_init_within(moe_ep_bootstrap_init, size); break;
    case 1: check_init_within(moe_ep_params_init, size); break;
    case 2: check_init_within(moe_ep_config_init, size); break;
    case 3: check_init_within(moe_ep_dispatch_args_init, size); break;
    case 4: check_init_within(moe_ep_dispatch_result_init, size); break;
    case 5: check_init_within(moe_ep_health_init, size); break;
    default: check_init_within(moe_ep_combine_result_init, size); break;
  }
}

// A struct_size: mostly valid, sometimes any value (cuts, huge, newer).
uint32_t pick_struct_size(FuzzedDataProvider& in, uint32_t real) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return in.ConsumeIntegral<uint32_t>();
    case 1: return in.ConsumeIntegralInRange<uint32_t>(0, real + 64);
    default: return real;
  }
}

// A versioned struct inside 1024 bytes (the library's cap on struct_size), so
// that any struct_size it may accept is backed by memory, as it would be for a
// real caller with a newer header.  The bytes past sizeof(T) are zero, or
// sometimes junk (which the library must reject for input structs).
template <typename T>
struct Boxed {
  alignas(16) unsigned char storage[1024] = {};
  T* get() { return reinterpret_cast<T*>(storage); }
  void seal(FuzzedDataProvider& in) {
    get()->struct_size = pick_struct_size(in, sizeof(T));
    if (in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      storage[in.ConsumeIntegralInRange<size_t>(sizeof(T), sizeof(storage) - 1)] = in.ConsumeIntegral<uint8_t>();
    }
  }
};

int32_t pick_int(FuzzedDataProvider& in, int32_t lo, int32_t hi) {
  return in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>()
                                                   : in.ConsumeIntegralInRange<int32_t>(lo, hi);
}

moe_ep_dtype_t pick_dtype(FuzzedDataProvider& in, moe_ep_dtype_t usual) {
  if (in.ConsumeIntegralInRange<int>(0, 3) != 0) return usual;
  static const moe_ep_dtype_t kDtypes[] = {{MOE_EP_DTYPE_BFLOAT, 16, 1}, {MOE_EP_DTYPE_FLOAT, 16, 1},
                                           {MOE_EP_DTYPE_FLOAT, 32, 1},  {MOE_EP_DTYPE_INT, 32, 1},
                                           {MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1}, {MOE_EP_DTYPE_FLOAT4_E2M1FN, 4, 1}};
  if (in.ConsumeBool()) return kDtypes[in.ConsumeIntegralInRange<size_t>(0, 5)];
  return moe_ep_dtype_t{in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint16_t>()};
}

// The 1-rank bootstrap: allgather copies, or (hostile) overwrites the result
// with fuzzer bytes.
struct BootstrapState {
  FuzzedDataProvider* in;
  bool hostile;
};

int32_t fuzz_allgather(void* ctx, const void* send, void* recv, size_t bytes) {
  auto* s = static_cast<BootstrapState*>(ctx);
  std::memcpy(recv, send, bytes);
  if (s->hostile && bytes > 0 && s->in->ConsumeBool()) {
    const size_t at = s->in->ConsumeIntegralInRange<size_t>(0, bytes - 1);
    const std::vector<uint8_t> junk = s->in->ConsumeBytes<uint8_t>(s->in->ConsumeIntegralInRange<size_t>(1, 16));
    for (size_t i = 0; i < junk.size() && at + i < bytes; ++i) static_cast<uint8_t*>(recv)[at + i] = junk[i];
  }
  return s->in->ConsumeIntegralInRange<int>(0, 63) == 0 ? 1 : 0;  // sometimes the bootstrap fails
}

int32_t fuzz_barrier(void*) { return 0; }

// A tensor over a buffer of `capacity` bytes (plus slack), whose description
// the fuzzer mangles.
struct FuzzTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::vector<uint8_t> buffer;
  moe_ep_tensor_t t{};

  FuzzTensor(FuzzedDataProvider& in, std::vector<int64_t> usual_shape, moe_ep_dtype_t usual_dtype, size_t capacity)
      : shape(std::move(usual_shape)), buffer(capacity + kSlack, 0x3C) {
    t.data = buffer.data();
    t.device = moe_ep_device_t{MOE_EP_DEVICE_CPU, 0};
    t.dtype = pick_dtype(in, usual_dtype);
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {  // another shape
      shape.resize(in.ConsumeIntegralInRange<size_t>(0, 4));
      for (auto& d : shape) d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-2, 40) : in.ConsumeIntegral<int64_t>();
    }
    t.ndim = static_cast<int32_t>(shape.size());
    t.shape = shape.data();
    switch (in.ConsumeIntegralInRange<int>(0, 7)) {
      case 0: t.ndim = in.ConsumeIntegral<int32_t>(); t.shape = shape.empty() ? nullptr : shape.data();
              if (t.ndim > static_cast<int32_t>(shape.size())) t.ndim = static_cast<int32_t>(shape.size()); break;
      case 1: t.data = nullptr; break;
      case 2: t.device = moe_ep_device_t{in.ConsumeIntegral<int32_t>(), in.ConsumeIntegral<int32_t>()}; break;
      default: break;
    }
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
      case 0: t.byte_offset = in.ConsumeIntegralInRange<uint64_t>(0, kSlack / 2); break;
      case 1: t.byte_offset = ~uint64_t{0} - in.ConsumeIntegralInRange<uint64_t>(0, 1u << 20); break;  // wraps
      default: break;
    }
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
      strides.resize(shape.size());
      for (auto& s : strides) s = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(-1, 64) : in.ConsumeIntegral<int64_t>();
      t.strides = strides.empty() ? nullptr : strides.data();
    }
  }
  const moe_ep_tensor_t* get() const { return &t; }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  BootstrapState state{&in, in.ConsumeBool()};
  check_inits(in);

  Boxed<moe_ep_params_t> boxed_params;
  moe_ep_params_t& p = *boxed_params.get();
  moe_ep_params_init(&p, sizeof p);
  p.num_experts = pick_int(in, 1, 16);
  p.top_k = pick_int(in, 1, 4);
  p.max_tokens_per_rank = pick_int(in, 1, 8);
  p.hidden_size = pick_int(in, 1, 24);
  p.hidden_dtype = pick_dtype(in, p.hidden_dtype);
  p.hidden_row_elems = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? pick_int(in, 0, 33) : 0;
  p.scale_row_elems = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? pick_int(in, 0, 4) : 0;
  p.invalid_expert_id = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>() : -1;
  p.enable_eplb_stats = in.ConsumeIntegralInRange<int32_t>(0, 2) == 2 ? in.ConsumeIntegral<int32_t>() : in.ConsumeBool();
  p.combine_dtype = pick_dtype(in, p.combine_dtype);
  boxed_params.seal(in);

  Boxed<moe_ep_config_t> boxed_config;
  moe_ep_config_t& c = *boxed_config.get();
  moe_ep_config_init(&c, sizeof c);
  c.backend = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>() : MOE_EP_BACKEND_HOST;
  c.timeout_ms = in.ConsumeIntegralInRange<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>() : 1000;
  boxed_config.seal(in);

  uint64_t workspace = 0;
  const int32_t world_for_size = pick_int(in, 1, 8);
  (void)moe_ep_workspace_size(&p, in.ConsumeBool() ? &c : nullptr, world_for_size, &workspace);
  workspace = 0;
  if (moe_ep_workspace_size(&p, &c, 1, &workspace) != MOE_EP_SUCCESS || workspace > kMaxWorkspace) return 0;

  Boxed<moe_ep_bootstrap_t> boxed_bootstrap;
  moe_ep_bootstrap_t& b = *boxed_bootstrap.get();
  moe_ep_bootstrap_init(&b, sizeof b);
  b.world_size = 1;
  b.ctx = &state;
  b.allgather = fuzz_allgather;
  b.barrier = fuzz_barrier;
  boxed_bootstrap.seal(in);
  moe_ep_handle_t h = nullptr;
  if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) return 0;

  // The params the library used: an older (smaller) struct_size means defaults
  // for the fields it does not cover, whatever the fuzzer wrote there.
  moe_ep_params_t used;
  moe_ep_params_init(&used, sizeof used);
  std::memcpy(&used, &p, p.struct_size < sizeof(used) ? p.struct_size : sizeof(used));

  // The group's true shapes, for buffers large enough for anything accepted.
  const int64_t M = used.max_tokens_per_rank, K = used.top_k, E = used.num_experts;
  const int64_t R = used.hidden_row_elems ? used.hidden_row_elems : used.hidden_size;
  const auto row_bytes = [](const moe_ep_dtype_t& d, int64_t elems) {
    return static_cast<size_t>((static_cast<int64_t>(d.bits) * d.lanes * elems + 7) / 8);
  };
  const size_t cap_hidden = static_cast<size_t>(M) * row_bytes(used.hidden_dtype, R);
  const size_t cap_ids = static_cast<size_t>(M * K * 4);
  const size_t cap_scales = static_cast<size_t>(M) * row_bytes(used.scale_dtype, used.scale_row_elems);
  const size_t cap_combine = static_cast<size_t>(M * used.hidden_size * 4);

  int32_t tpr = static_cast<int32_t>(M);
  for (int op = 0; op < 6 && in.remaining_bytes() > 0; ++op) {
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
      case 0: {  // dispatch
        const int64_t T = in.ConsumeIntegralInRange<int64_t>(0, M);
        FuzzTensor x(in, {T, R}, used.hidden_dtype, cap_hidden);
        FuzzTensor ids(in, {T, K}, moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}, cap_ids);
        for (size_t i = 0; i + 4 <= ids.buffer.size(); i += 4) {
          int32_t id = in.ConsumeIntegralInRange<int32_t>(-2, static_cast<int32_t>(E));
          std::memcpy(ids.buffer.data() + i, &id, 4);
        }
        FuzzTensor w(in, {T, K}, moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1}, cap_ids);
        FuzzTensor s(in, {T, used.scale_row_elems}, used.scale_dtype, cap_scales);
        FuzzTensor st(in, {E}, moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}, static_cast<size_t>(E * 4));
        Boxed<moe_ep_dispatch_args_t> boxed_args;
        moe_ep_dispatch_args_t& a = *boxed_args.get();
        moe_ep_dispatch_args_init(&a, sizeof a);
        a.hidden_states = in.ConsumeIntegralInRange<int>(0, 15) ? x.get() : nullptr;
        a.topk_ids = in.ConsumeIntegralInRange<int>(0, 15) ? ids.get() : nullptr;
        a.topk_weights = in.ConsumeBool() ? w.get() : nullptr;
        a.hidden_states_scale = used.scale_row_elems > 0 || in.ConsumeIntegralInRange<int>(0, 7) == 0 ? s.get() : nullptr;
        a.eplb_local_stats = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? st.get() : nullptr;
        a.runtime_max_tokens_per_rank = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? pick_int(in, 0, static_cast<int32_t>(M)) : 0;
        boxed_args.seal(in);
        Boxed<moe_ep_dispatch_result_t> boxed_result;
        moe_ep_dispatch_result_t& r = *boxed_result.get();
        moe_ep_dispatch_result_init(&r, sizeof r);
        boxed_result.seal(in);
        if (moe_ep_dispatch(h, &a, &r, nullptr) == MOE_EP_SUCCESS && r.struct_size >= sizeof(uint32_t) * 2) {
          tpr = r.tokens_per_rank;
        }
        break;
      }
      case 1: {  // combine
        const bool three_d = in.ConsumeBool();
        std::vector<int64_t> shape = three_d ? std::vector<int64_t>{1, tpr, used.hidden_size}
                                             : std::vector<int64_t>{tpr, used.hidden_size};
        FuzzTensor eo(in, shape, used.combine_dtype, cap_combine);
        FuzzTensor out(in, {M, used.hidden_size}, used.combine_dtype, cap_combine);
        Boxed<moe_ep_combine_result_t> boxed_result;
        moe_ep_combine_result_t& r = *boxed_result.get();
        moe_ep_combine_result_init(&r, sizeof r);
        boxed_result.seal(in);
        (void)moe_ep_combine(h, eo.get(), in.ConsumeBool() ? out.get() : nullptr, &r, nullptr);
        break;
      }
      case 2: {
        moe_ep_status_t s = MOE_EP_SUCCESS;
        (void)moe_ep_get_async_error(h, &s);
        break;
      }
      case 3: {  // the health poll and the active-rank mask (a 1-rank group: only {1} is a valid mask)
        Boxed<moe_ep_health_t> boxed_health;
        moe_ep_health_init(boxed_health.get(), sizeof(moe_ep_health_t));
        boxed_health.seal(in);
        (void)moe_ep_poll_health(h, in.ConsumeIntegralInRange<int>(0, 15) ? boxed_health.get() : nullptr);
        uint8_t mask[4] = {in.ConsumeIntegral<uint8_t>(), 1, 1, 1};
        const int32_t world = pick_int(in, 0, 4);
        uint8_t* p = in.ConsumeIntegralInRange<int>(0, 15) ? mask : nullptr;
        // world_size is checked before the mask is read: only 1 (the handle's) reads mask[0].
        (void)(in.ConsumeBool() ? moe_ep_set_active_ranks(h, p, world) : moe_ep_get_active_ranks(h, p, world));
        break;
      }
      default:
        (void)moe_ep_last_error();
        break;
    }
  }
  moe_ep_destroy(&h);
  return 0;
}
