// Zero-copy combine input (config->zero_copy_combine): the dispatch result's
// combine_input view, combine reading it in place, its validation, the grown
// structs' versioning and the workspace it costs.  HOST backend, ranks as threads.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

using namespace moe_ep_test;

namespace {

// Catch's macros are not thread safe: rank threads check with NEED, which
// throws; run_ranks rethrows the first failure on the test's thread.
void need(bool ok, const char* what, int line, const std::string& context = "") {
  if (!ok) {
    throw std::runtime_error("line " + std::to_string(line) + ": " + what +
                             (context.empty() ? "" : " (" + context + ")") + "; last error: " + moe_ep_last_error());
  }
}
#define NEED(cond) need((cond), #cond, __LINE__)
#define NEED_IN(cond, context) need((cond), #cond, __LINE__, (context))

constexpr int32_t kHidden = 24;
constexpr int32_t kTopK = 3;
constexpr int32_t kMaxTokens = 9;

moe_ep_params_t zc_params(int world) { return make_params(4 * world, kTopK, kMaxTokens, kHidden); }

moe_ep_config_t zc_config(int32_t zero_copy) {
  moe_ep_config_t c = host_config();
  c.zero_copy_combine = zero_copy;
  return c;
}

// bf16 bits of a float that bf16 holds exactly (small multiples of 1/4).
uint16_t bf16_bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return static_cast<uint16_t>(u >> 16);
}

// One rank's dispatch inputs, deterministic per (rank, round).
struct Inputs {
  int64_t hidden_shape[2], ids_shape[2];
  std::vector<uint16_t> hidden;
  std::vector<int32_t> ids;
  moe_ep_tensor_t hidden_t{}, ids_t{};
  moe_ep_dispatch_args_t args{};

  Inputs(int rank, int world, int32_t tokens, int32_t runtime_max, int round)
      : hidden_shape{tokens, kHidden}, ids_shape{tokens, kTopK} {
    hidden.assign(static_cast<size_t>(tokens) * kHidden, bf16_bits(1.0f));
    for (int32_t t = 0; t < tokens; ++t) {
      for (int32_t k = 0; k < kTopK; ++k) ids.push_back((rank * 5 + t * 3 + k * 7 + round) % (4 * world));
    }
    hidden_t = cpu_tensor(hidden.data(), moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}, hidden_shape, 2);
    ids_t = cpu_tensor(ids.data(), moe_ep_dtype_t{MOE_EP_DTYPE_INT, 32, 1}, ids_shape, 2);
    moe_ep_dispatch_args_init(&args, sizeof args);
    args.hidden_states = &hidden_t;
    args.topk_ids = &ids_t;
    args.runtime_max_tokens_per_rank = runtime_max;
  }
};

// Expert output values for receive row `row`, column `col` on `rank`.
uint16_t expert_value(int rank, int64_t row, int64_t col, int round) {
  return bf16_bits(static_cast<float>((rank * 11 + row * 3 + col + round) % 17) * 0.25f - 2.0f);
}

// Runs one dispatch/combine pair; the expert output is written into the
// combine_input view and passed either as the view itself (3-D form when
// `split`) or as a copy in the caller's own buffer.  Returns combine's output.
std::vector<uint16_t> pair(moe_ep_handle_t h, int rank, int world, int32_t runtime_max, int round, bool use_view,
                           bool split) {
  const int32_t tpr = runtime_max ? runtime_max : kMaxTokens;
  const int32_t tokens = (rank + round) % (tpr + 1);
  Inputs in(rank, world, tokens, runtime_max, round);
  moe_ep_dispatch_result_t res;
  moe_ep_dispatch_result_init(&res, sizeof res);
  NEED(moe_ep_dispatch(h, &in.args, &res, nullptr) == MOE_EP_SUCCESS);
  const int64_t P = static_cast<int64_t>(world) * tpr;
  NEED(res.combine_input.data != nullptr);
  NEED(res.combine_input.ndim == 2);
  NEED(res.combine_input.shape[0] == P);
  NEED(res.combine_input.shape[1] == kHidden);
  NEED(res.combine_input.dtype.code == MOE_EP_DTYPE_BFLOAT);
  NEED(res.combine_input.dtype.bits == 16);
  NEED(res.combine_input.device.device_type == MOE_EP_DEVICE_CPU);
  auto* view = static_cast<uint16_t*>(res.combine_input.data);
  std::vector<uint16_t> copy(static_cast<size_t>(P) * kHidden);
  for (int64_t r = 0; r < P; ++r) {
    for (int64_t c = 0; c < kHidden; ++c) copy[r * kHidden + c] = expert_value(rank, r, c, round);
  }
  std::memcpy(view, copy.data(), copy.size() * sizeof(uint16_t));

  int64_t flat_shape[2] = {P, kHidden};
  int64_t split_shape[3] = {world, tpr, kHidden};
  const moe_ep_dtype_t bf16{MOE_EP_DTYPE_BFLOAT, 16, 1};
  moe_ep_tensor_t expert = use_view && !split ? res.combine_input
                           : use_view         ? cpu_tensor(view, bf16, split_shape, 3)
                                              : cpu_tensor(copy.data(), bf16, flat_shape, 2);
  std::vector<uint16_t> out(static_cast<size_t>(tokens) * kHidden, 0xFFFF);
  int64_t out_shape[2] = {tokens, kHidden};
  moe_ep_tensor_t out_t = cpu_tensor(out.data(), bf16, out_shape, 2);
  moe_ep_combine_result_t cres;
  moe_ep_combine_result_init(&cres, sizeof cres);
  NEED(moe_ep_combine(h, &expert, &out_t, &cres, nullptr) == MOE_EP_SUCCESS);
  return out;
}

moe_ep_handle_t create(const moe_ep_bootstrap_t& b, const moe_ep_config_t& c) {
  const moe_ep_params_t p = zc_params(b.world_size);
  moe_ep_handle_t h = nullptr;
  NEED(moe_ep_create(&b, &p, &c, &h) == MOE_EP_SUCCESS);
  return h;
}

}  // namespace

TEST_CASE("zero-copy combine: the view combines bitwise like a copy of it, 1 to 4 ranks", "[host][zero_copy]") {
  for (int world = 1; world <= 4; ++world) {
    run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) {
      const moe_ep_config_t c = zc_config(1);
      moe_ep_handle_t h = create(b, c);
      for (int32_t runtime_max : {0, 5}) {
        for (int round = 0; round < 2; ++round) {
          const bool split = round == 1;
          const std::vector<uint16_t> from_view = pair(h, rank, world, runtime_max, round, true, split);
          const std::vector<uint16_t> from_copy = pair(h, rank, world, runtime_max, round, false, false);
          const std::string where = "world " + std::to_string(world) + " rank " + std::to_string(rank) +
                                    " runtime_max " + std::to_string(runtime_max) + " round " + std::to_string(round);
          NEED_IN(from_view == from_copy, where);
          // The rows really moved: some output is not the 0xFFFF the buffer started with.
          for (uint16_t v : from_view) NEED(v != 0xFFFF);
        }
      }
      NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS);
    });
  }
}

TEST_CASE("zero-copy combine: no view without the flag", "[host][zero_copy]") {
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, zc_config(0));
    Inputs in(rank, 2, 4, 0, 0);
    moe_ep_dispatch_result_t res;
    moe_ep_dispatch_result_init(&res, sizeof res);
    NEED(moe_ep_dispatch(h, &in.args, &res, nullptr) == MOE_EP_SUCCESS);
    NEED(res.combine_input.data == nullptr);
    NEED(res.combine_input.ndim == 0);
    std::vector<uint16_t> expert(static_cast<size_t>(2) * kMaxTokens * kHidden, bf16_bits(1.0f));
    int64_t shape[2] = {2 * kMaxTokens, kHidden};
    moe_ep_tensor_t e = cpu_tensor(expert.data(), moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}, shape, 2);
    moe_ep_combine_result_t cres;
    moe_ep_combine_result_init(&cres, sizeof cres);
    NEED(moe_ep_combine(h, &e, nullptr, &cres, nullptr) == MOE_EP_SUCCESS);
    NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS);
  });
}

TEST_CASE("zero-copy combine: a stale, reshaped or overlapping view is refused", "[host][zero_copy]") {
  run_ranks(1, [&](int, const moe_ep_bootstrap_t& b) {
    moe_ep_handle_t h = create(b, zc_config(1));
    moe_ep_combine_result_t cres;
    moe_ep_combine_result_init(&cres, sizeof cres);
    // A view from a dispatch of tokens_per_rank 5 ...
    Inputs small(0, 1, 3, 5, 0);
    moe_ep_dispatch_result_t res;
    moe_ep_dispatch_result_init(&res, sizeof res);
    NEED(moe_ep_dispatch(h, &small.args, &res, nullptr) == MOE_EP_SUCCESS);
    const moe_ep_tensor_t stale = res.combine_input;
    int64_t stale_shape[2] = {stale.shape[0], stale.shape[1]};
    moe_ep_tensor_t kept = stale;
    kept.shape = stale_shape;  // the caller's copy of the shape outlives the view's
    NEED(moe_ep_combine(h, &stale, nullptr, &cres, nullptr) == MOE_EP_SUCCESS);
    // ... after the pair: no dispatch in flight.
    NEED(moe_ep_combine(h, &kept, nullptr, &cres, nullptr) == MOE_EP_ERROR_INVALID_STATE);
    // ... passed to the combine of a later dispatch of tokens_per_rank 9.
    Inputs full(0, 1, 3, 0, 0);
    NEED(moe_ep_dispatch(h, &full.args, &res, nullptr) == MOE_EP_SUCCESS);
    NEED(moe_ep_combine(h, &kept, nullptr, &cres, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    NEED(std::string(moe_ep_last_error()).find("combine_input") != std::string::npos);
    // A tensor that starts inside the view.
    moe_ep_tensor_t inside = res.combine_input;
    inside.byte_offset = 2 * kHidden;  // one bf16 row further
    NEED(moe_ep_combine(h, &inside, nullptr, &cres, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    NEED(std::string(moe_ep_last_error()).find("overlaps the combine_input view") != std::string::npos);
    // A tensor that starts before the view and runs into it (never read: refused first).
    moe_ep_tensor_t before = res.combine_input;
    before.data = static_cast<char*>(res.combine_input.data) - 2;
    NEED(moe_ep_combine(h, &before, nullptr, &cres, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    NEED(std::string(moe_ep_last_error()).find("starts before") != std::string::npos);
    // The handle is still usable: the view itself combines.
    NEED(moe_ep_combine(h, &res.combine_input, nullptr, &cres, nullptr) == MOE_EP_SUCCESS);
    NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS);
  });
}

TEST_CASE("zero-copy combine: older struct sizes of the grown structs", "[host][zero_copy][versioning]") {
  run_ranks(1, [&](int, const moe_ep_bootstrap_t& b) {
    // A 0.1 config (it ended at device) gets zero_copy_combine = 0.
    moe_ep_config_t c = zc_config(1);
    c.struct_size = offsetof(moe_ep_config_t, zero_copy_combine);
    moe_ep_handle_t h = create(b, c);
    Inputs in(0, 1, 2, 0, 0);
    // A 0.1 dispatch result (it ended at eplb_gathered_stats): nothing written beyond it.
    moe_ep_dispatch_result_t res;
    moe_ep_dispatch_result_init(&res, sizeof res);
    std::memset(&res.combine_input, 0xAB, sizeof(res.combine_input));
    res.struct_size = offsetof(moe_ep_dispatch_result_t, combine_input);
    NEED(moe_ep_dispatch(h, &in.args, &res, nullptr) == MOE_EP_SUCCESS);
    const auto* tail = reinterpret_cast<const unsigned char*>(&res.combine_input);
    for (size_t i = 0; i < sizeof(res.combine_input); ++i) NEED(tail[i] == 0xAB);
    NEED(res.hidden_states.data != nullptr);
    std::vector<uint16_t> expert(static_cast<size_t>(kMaxTokens) * kHidden, 0);
    int64_t shape[2] = {kMaxTokens, kHidden};
    moe_ep_tensor_t e = cpu_tensor(expert.data(), moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}, shape, 2);
    moe_ep_combine_result_t cres;
    moe_ep_combine_result_init(&cres, sizeof cres);
    NEED(moe_ep_combine(h, &e, nullptr, &cres, nullptr) == MOE_EP_SUCCESS);
    // The old-size config created a handle without the view.
    moe_ep_dispatch_result_init(&res, sizeof res);
    NEED(moe_ep_dispatch(h, &in.args, &res, nullptr) == MOE_EP_SUCCESS);
    NEED(res.combine_input.data == nullptr);
    NEED(moe_ep_combine(h, &e, nullptr, &cres, nullptr) == MOE_EP_SUCCESS);
    NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS);
  });
  // Sizes that cut the new fields are refused; the defaults leave the flag off.
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  CHECK(c.zero_copy_combine == 0);
  CHECK(c.struct_size == sizeof(moe_ep_config_t));
  moe_ep_dispatch_result_t r;
  moe_ep_dispatch_result_init(&r, sizeof r);
  CHECK(r.struct_size == sizeof(moe_ep_dispatch_result_t));
  CHECK(r.combine_input.data == nullptr);
  const moe_ep_params_t p = zc_params(1);
  uint64_t bytes = 0;
  c.struct_size = offsetof(moe_ep_config_t, zero_copy_combine) + 2;
  CHECK(moe_ep_workspace_size(&p, &c, 1, &bytes) == MOE_EP_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("zero-copy combine: the HOST workspace grows by exactly the region", "[host][zero_copy]") {
  for (int world = 1; world <= 4; ++world) {
    const moe_ep_params_t p = zc_params(world);
    moe_ep_config_t off = zc_config(0), on = zc_config(1);
    uint64_t without = 0, with = 0;
    REQUIRE(moe_ep_workspace_size(&p, &off, world, &without) == MOE_EP_SUCCESS);
    REQUIRE(moe_ep_workspace_size(&p, &on, world, &with) == MOE_EP_SUCCESS);
    CHECK(with - without == static_cast<uint64_t>(world) * kMaxTokens * kHidden * 2);
    on.zero_copy_combine = 7;  // a flag: anything but 0 is on
    REQUIRE(moe_ep_workspace_size(&p, &on, world, &with) == MOE_EP_SUCCESS);
    CHECK(with - without == static_cast<uint64_t>(world) * kMaxTokens * kHidden * 2);
  }
}
