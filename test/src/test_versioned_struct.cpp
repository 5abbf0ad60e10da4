// Versioned structs (docs/api.md, "Struct growth"): every *_init() takes the
// caller's size and writes exactly that many bytes; older, smaller input
// structs get defaults for their missing tail; newer, larger ones are accepted
// only with a zero tail; the results the library writes never go past the
// caller's struct_size.  Every sweep puts a canary after the struct.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "case_skip.hpp"
#include "moe_ep_c.h"
#include "params.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"
#include "versioned_struct.hpp"

using Catch::Matchers::Contains;

namespace {

using moe_ep_test::cpu_tensor;

moe_ep_params_t valid_params() { return moe_ep_test::make_params(8, 2, 4, 16); }

constexpr size_t kCanaryBytes = 64;
constexpr unsigned char kCanary = 0xA5;

// A caller's struct of `size` bytes followed by kCanaryBytes of canary, all
// filled with the canary first; aligned for every public struct.
class Buffer {
 public:
  explicit Buffer(size_t size) : size_(size), words_((size + kCanaryBytes) / 8 + 1) {
    std::memset(words_.data(), kCanary, words_.size() * 8);
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(words_.data());
  }
  const unsigned char* bytes() const { return reinterpret_cast<const unsigned char*>(words_.data()); }
  uint32_t struct_size() const {
    uint32_t s = 0;
    std::memcpy(&s, bytes(), sizeof(s));
    return s;
  }
  // The first byte in [from, to) that is not `value`, or -1.
  long first_not(size_t from, size_t to, unsigned char value) const {
    for (size_t i = from; i < to; ++i) {
      if (bytes()[i] != value) return static_cast<long>(i);
    }
    return -1;
  }
  long canary_damage() const { return first_not(size_, size_ + kCanaryBytes, kCanary); }

 private:
  size_t size_;
  std::vector<uint64_t> words_;
};

// The sizes the rule accepts for T, written independently of the library:
// every field end of the current layout at or past the first released
// sizeof, the released sizeofs, and newer sizes (multiples of the alignment
// up to 1024).
template <typename T>
bool expected_valid(size_t size) {
  using L = moe_ep::StructLayout<T>;
  size_t first = sizeof(T);
  for (size_t r : L::released_sizes) first = r < first ? r : first;
  if (size < first) return false;
  if (size > sizeof(T)) return size <= 1024 && size % alignof(T) == 0;
  for (size_t e : L::field_ends) {
    if (e == size) return true;
  }
  for (size_t r : L::released_sizes) {
    if (r == size) return true;
  }
  return false;
}

template <typename T>
using InitFn = moe_ep_status_t (*)(T*, size_t);

// Every size from 0 to past the cap, for one init function.
template <typename T>
void sweep_init(InitFn<T> init) {
  using L = moe_ep::StructLayout<T>;
  INFO(L::init_name);
  // The library's defaults at its own size.
  Buffer full(sizeof(T));
  REQUIRE(init(full.template as<T>(), sizeof(T)) == MOE_EP_SUCCESS);
  REQUIRE(full.struct_size() == sizeof(T));
  REQUIRE(full.canary_damage() == -1);

  size_t accepted = 0;
  for (size_t size = 0; size <= moe_ep::kMaxStructSize + 24; ++size) {
    INFO("struct_size " << size);
    Buffer b(size);
    const moe_ep_status_t s = init(b.template as<T>(), size);
    CHECK(b.canary_damage() == -1);
    if (expected_valid<T>(size)) {
      ++accepted;
      REQUIRE(s == MOE_EP_SUCCESS);
      CHECK(b.struct_size() == size);
      const size_t known = size < sizeof(T) ? size : sizeof(T);
      CHECK(std::memcmp(b.bytes() + 4, full.bytes() + 4, known - 4) == 0);  // the defaults that fit
      CHECK(b.first_not(sizeof(T), size, 0) == -1);                         // a newer caller's tail: zero
    } else {
      REQUIRE(s == MOE_EP_ERROR_INVALID_ARGUMENT);
      const std::string message = moe_ep_last_error();
      CHECK_THAT(message, Contains(std::string("struct_size of ") + L::init_name) &&
                              Contains(std::string("sizeof(") + L::c_name + ")") &&
                              Contains("got " + std::to_string(size)));
      CHECK(b.first_not(0, size, kCanary) == -1);  // nothing written
    }
  }
  CHECK(accepted > 0);
  // Absurd sizes and NULL.
  Buffer b(16);
  CHECK(init(b.template as<T>(), size_t{1} << 40) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("got 1099511627776"));
  CHECK(b.first_not(0, 16 + kCanaryBytes, kCanary) == -1);
  CHECK(init(nullptr, sizeof(T)) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(moe_ep_last_error(), Contains("NULL"));
}

}  // namespace

TEST_CASE("the released layouts are the ones the rule and the docs name", "[versioning]") {
  // docs/api.md lists these sizes (LP64).  A change here is an ABI break.
  if (sizeof(void*) != 8) {
    moe_ep_test::skip_case("the documented sizes are those of LP64 targets");
    return;
  }
  using namespace moe_ep;
  CHECK(first_released_size<moe_ep_bootstrap_t>() == 40);
  CHECK(first_released_size<moe_ep_params_t>() == 48);
  CHECK(first_released_size<moe_ep_config_t>() == 20);
  CHECK(sizeof(moe_ep_config_t) == 56);
  CHECK(offsetof(moe_ep_config_t, failure_policy) == 28);
  CHECK(offsetof(moe_ep_config_t, store_address) == 40);
  CHECK(first_released_size<moe_ep_dispatch_args_t>() == 56);
  CHECK(first_released_size<moe_ep_dispatch_result_t>() == 344);
  CHECK(sizeof(moe_ep_dispatch_result_t) == 632);
  CHECK(sizeof(moe_ep_params_t) == 88);
  CHECK(offsetof(moe_ep_params_t, receive_layout) == 48);
  CHECK(offsetof(moe_ep_params_t, scale_layout) == 68);
  CHECK(offsetof(moe_ep_params_t, dispatch_wire) == 72);
  CHECK(offsetof(moe_ep_params_t, dispatch_dequantize) == 84);
  CHECK(offsetof(moe_ep_dispatch_result_t, expert_counts) == 392);
  CHECK(offsetof(moe_ep_dispatch_result_t, dropped_pairs) == 584);
  CHECK(first_released_size<moe_ep_combine_result_t>() == 56);
  CHECK(offsetof(moe_ep_config_t, zero_copy_combine) == 20);
  CHECK(offsetof(moe_ep_config_t, micro_batches) == 24);
  CHECK(offsetof(moe_ep_dispatch_result_t, combine_input) == 344);
}

TEST_CASE("every init writes exactly the caller's size, from every released layout to larger ones", "[versioning]") {
  sweep_init<moe_ep_bootstrap_t>(moe_ep_bootstrap_init);
  sweep_init<moe_ep_params_t>(moe_ep_params_init);
  sweep_init<moe_ep_config_t>(moe_ep_config_init);
  sweep_init<moe_ep_dispatch_args_t>(moe_ep_dispatch_args_init);
  sweep_init<moe_ep_dispatch_result_t>(moe_ep_dispatch_result_init);
  sweep_init<moe_ep_combine_result_t>(moe_ep_combine_result_init);
}

TEST_CASE("init functions fill the documented defaults", "[versioning]") {
  moe_ep_params_t p;
  std::memset(&p, 0xAB, sizeof(p));
  REQUIRE(moe_ep_params_init(&p, sizeof p) == MOE_EP_SUCCESS);
  CHECK(p.struct_size == sizeof(p));
  CHECK(p.invalid_expert_id == -1);
  CHECK(p.hidden_dtype.code == MOE_EP_DTYPE_BFLOAT);
  CHECK(p.hidden_dtype.bits == 16);
  CHECK(p.scale_dtype.code == MOE_EP_DTYPE_FLOAT);
  CHECK(p.combine_dtype.code == MOE_EP_DTYPE_BFLOAT);
  CHECK(p.enable_eplb_stats == 0);
  CHECK(p.num_experts == 0);
  CHECK(p.receive_layout == MOE_EP_LAYOUT_RANK_MAJOR);
  CHECK(p.expert_capacity == 0);
  CHECK(p.expert_alignment == 0);
  CHECK(p.expert_rows == 0);
  CHECK(p.expert_output_weighted == 0);
  CHECK(p.scale_layout == MOE_EP_SCALES_ROW_MAJOR);
  CHECK(p.dispatch_wire == MOE_EP_WIRE_AS_IS);
  CHECK(p.combine_wire == MOE_EP_WIRE_AS_IS);
  CHECK(p.wire_scale == MOE_EP_WIRE_SCALE_FP32);
  CHECK(p.dispatch_dequantize == 0);

  moe_ep_config_t c;
  REQUIRE(moe_ep_config_init(&c, sizeof c) == MOE_EP_SUCCESS);
  CHECK(c.struct_size == sizeof(c));
  CHECK(c.backend == MOE_EP_BACKEND_AUTO);
  CHECK(c.num_sms == 0);
  CHECK(c.timeout_ms == 30000);
  CHECK(c.device == -1);
  CHECK(c.zero_copy_combine == 0);
  CHECK(c.micro_batches == 1);

  // A 0.1 config (it ended at device): the defaults of the four fields it has.
  Buffer old(offsetof(moe_ep_config_t, zero_copy_combine));
  REQUIRE(moe_ep_config_init(old.as<moe_ep_config_t>(), offsetof(moe_ep_config_t, zero_copy_combine)) ==
          MOE_EP_SUCCESS);
  CHECK(old.as<moe_ep_config_t>()->timeout_ms == 30000);
  CHECK(old.as<moe_ep_config_t>()->device == -1);
  CHECK(old.canary_damage() == -1);

  moe_ep_bootstrap_t b;
  REQUIRE(moe_ep_bootstrap_init(&b, sizeof b) == MOE_EP_SUCCESS);
  CHECK(b.struct_size == sizeof(b));
  CHECK(b.allgather == nullptr);
  moe_ep_dispatch_args_t a;
  REQUIRE(moe_ep_dispatch_args_init(&a, sizeof a) == MOE_EP_SUCCESS);
  CHECK(a.struct_size == sizeof(a));
  CHECK(a.runtime_max_tokens_per_rank == 0);
}

TEST_CASE("an older config gets defaults for every field past its size", "[versioning]") {
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  c.backend = MOE_EP_BACKEND_HOST;
  c.num_sms = 7;
  c.device = 3;
  c.zero_copy_combine = 5;  // beyond the 0.1 size: must be ignored
  c.struct_size = offsetof(moe_ep_config_t, zero_copy_combine);
  const moe_ep_config_t merged = moe_ep::read_config(&c);
  CHECK(merged.struct_size == sizeof(moe_ep_config_t));
  CHECK(merged.backend == MOE_EP_BACKEND_HOST);
  CHECK(merged.num_sms == 7);
  CHECK(merged.device == 3);
  CHECK(merged.zero_copy_combine == 0);
}

TEST_CASE("0.1 params (ending at combine_dtype) get the rank-major layout; the receive layout fields are read past it",
          "[versioning]") {
  moe_ep_params_t p = valid_params();
  p.receive_layout = 7;  // beyond the 0.1 size: must be ignored
  p.expert_capacity = -3;
  p.struct_size = static_cast<uint32_t>(offsetof(moe_ep_params_t, receive_layout));
  const moe_ep_params_t merged = moe_ep::read_params(&p);
  CHECK(merged.struct_size == sizeof(moe_ep_params_t));
  CHECK(merged.receive_layout == MOE_EP_LAYOUT_RANK_MAJOR);
  CHECK(merged.expert_capacity == 0);
  CHECK(merged.num_experts == p.num_experts);

  // A size ending after receive_layout (a field boundary) reads it, and the rest default.
  p = valid_params();
  p.receive_layout = MOE_EP_LAYOUT_EXPERT_PACKED;
  p.expert_capacity = 99;  // past the size: ignored
  p.struct_size = static_cast<uint32_t>(offsetof(moe_ep_params_t, expert_capacity));
  const moe_ep_params_t partial = moe_ep::read_params(&p);
  CHECK(partial.receive_layout == MOE_EP_LAYOUT_EXPERT_PACKED);
  CHECK(partial.expert_capacity == 0);
  CHECK(partial.expert_alignment == 1);  // 0 = 1 for EXPERT_PACKED
}

TEST_CASE("params ending at scale_layout get the AS_IS wire; the wire fields are read past it", "[versioning][wire]") {
  moe_ep_params_t p = valid_params();
  p.dispatch_wire = 9;  // beyond that size: must be ignored
  p.wire_scale = -1;
  p.struct_size = static_cast<uint32_t>(offsetof(moe_ep_params_t, dispatch_wire));
  const moe_ep_params_t merged = moe_ep::read_params(&p);
  CHECK(merged.struct_size == sizeof(moe_ep_params_t));
  CHECK(merged.dispatch_wire == MOE_EP_WIRE_AS_IS);
  CHECK(merged.combine_wire == MOE_EP_WIRE_AS_IS);
  CHECK(merged.wire_scale == MOE_EP_WIRE_SCALE_FP32);
  CHECK(merged.dispatch_dequantize == 0);

  // A size ending after combine_wire reads both wires, and the rest default.
  p = valid_params();
  p.dispatch_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  p.combine_wire = MOE_EP_WIRE_FP8_E4M3_BLOCK128;
  p.wire_scale = 5;  // past the size: ignored
  p.struct_size = static_cast<uint32_t>(offsetof(moe_ep_params_t, wire_scale));
  const moe_ep_params_t partial = moe_ep::read_params(&p);
  CHECK(partial.dispatch_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128);
  CHECK(partial.combine_wire == MOE_EP_WIRE_FP8_E4M3_BLOCK128);
  CHECK(partial.wire_scale == MOE_EP_WIRE_SCALE_FP32);
  CHECK(partial.dispatch_dequantize == 0);
}

TEST_CASE("a newer, larger struct is accepted only if its unknown tail is zero", "[versioning]") {
  struct Bigger {
    moe_ep_params_t known;
    int32_t future[4];
  } big{};
  REQUIRE(moe_ep_params_init(&big.known, sizeof big) == MOE_EP_SUCCESS);
  CHECK(big.known.struct_size == sizeof(big));
  const moe_ep_params_t p = valid_params();
  big.known.num_experts = p.num_experts;
  big.known.top_k = p.top_k;
  big.known.max_tokens_per_rank = p.max_tokens_per_rank;
  big.known.hidden_size = p.hidden_size;
  const moe_ep_params_t merged = moe_ep::read_params(&big.known);
  CHECK(merged.num_experts == 8);

  big.future[2] = 1;
  try {
    moe_ep::read_params(&big.known);
    FAIL("expected an error");
  } catch (const moe_ep::Error& e) {
    CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(e.what(), Contains("params") && Contains("newer header") && Contains("offset"));
  }
}

TEST_CASE("hostile struct_size values are INVALID_ARGUMENT naming the struct", "[versioning]") {
  SECTION("below the first released layout") {
    moe_ep_params_t p = valid_params();
    p.struct_size = offsetof(moe_ep_params_t, enable_eplb_stats);  // never released
    try {
      moe_ep::read_params(&p);
      FAIL("expected an error");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(e.what(), Contains("params->struct_size") && Contains("one of 48, 52") && Contains("got 40") &&
                               Contains("moe_ep_params_init"));
    }
  }
  SECTION("args.struct_size = 12 cuts the hidden_states pointer") {
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a, sizeof a);
    a.struct_size = 12;
    moe_ep_dispatch_args_t defaults{};
    try {
      moe_ep::read_versioned(&a, defaults, "args");
      FAIL("expected an error");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(e.what(), Contains("args->struct_size") && Contains("moe_ep_dispatch_args_t") &&
                               Contains("one of 56 ") && Contains("got 12"));
    }
  }
  SECTION("0xFFFFFFFF is never read") {
    moe_ep_params_t p = valid_params();
    p.struct_size = 0xFFFFFFFFu;
    try {
      moe_ep::read_params(&p);
      FAIL("expected an error");
    } catch (const moe_ep::Error& e) {
      CHECK(e.status() == MOE_EP_ERROR_INVALID_ARGUMENT);
      CHECK_THAT(e.what(), Contains("params->struct_size") && Contains("moe_ep_params_t") &&
                               Contains("1024") && Contains("got 4294967295"));
    }
  }
  SECTION("a newer size that is not a multiple of the alignment") {
    struct Bigger {
      moe_ep_config_t known;
      int32_t future[4];
    } big{};
    moe_ep_config_init(&big.known, sizeof big.known);
    big.known.struct_size = sizeof(moe_ep_config_t) + 2;
    CHECK_THROWS_AS(moe_ep::read_config(&big.known), moe_ep::Error);
    big.known.struct_size = sizeof(moe_ep_config_t) + 8;  // one more pointer-aligned field: fine
    CHECK(moe_ep::read_config(&big.known).timeout_ms == 30000);
  }
}

TEST_CASE("every input struct_size: accepted exactly where the rule says", "[versioning]") {
  auto sweep = [](auto tag) {
    using T = decltype(tag);
    INFO(moe_ep::StructLayout<T>::c_name);
    for (size_t size = 0; size <= moe_ep::kMaxStructSize + 16; ++size) {
      INFO("struct_size " << size);
      CHECK(moe_ep::is_valid_struct_size<T>(size) == expected_valid<T>(size));
    }
    CHECK_FALSE(moe_ep::is_valid_struct_size<T>(0xFFFFFFFFu));
  };
  sweep(moe_ep_bootstrap_t{});
  sweep(moe_ep_params_t{});
  sweep(moe_ep_config_t{});
  sweep(moe_ep_dispatch_args_t{});
  sweep(moe_ep_dispatch_result_t{});
  sweep(moe_ep_combine_result_t{});
  CHECK(moe_ep::is_valid_struct_size<moe_ep_config_t>(20));                  // 0.1
  CHECK_FALSE(moe_ep::is_valid_struct_size<moe_ep_config_t>(16));            // before the first release
  CHECK(moe_ep::is_valid_struct_size<moe_ep_dispatch_result_t>(344));        // 0.1
  CHECK_FALSE(moe_ep::is_valid_struct_size<moe_ep_dispatch_result_t>(352));  // inside combine_input
}

// ---------------------------------------------------------------------------
// The outputs the library writes: HOST dispatch and combine, ranks as threads.
// ---------------------------------------------------------------------------

namespace {

// Rank threads must not use Catch's macros: they throw, run_ranks rethrows the
// first failure on the test's thread.
void need(bool ok, const char* what, int line, const std::string& context) {
  if (!ok) {
    throw std::runtime_error("line " + std::to_string(line) + ": " + what + " (" + context +
                             "); last error: " + moe_ep_last_error());
  }
}
#define NEED(cond, context) need((cond), #cond, __LINE__, (context))

constexpr int32_t kHidden = 12;
constexpr int32_t kTopK = 2;
constexpr int32_t kMaxTokens = 5;

int64_t elements(const moe_ep_tensor_t& t) {
  int64_t n = 1;
  for (int32_t d = 0; d < t.ndim; ++d) n *= t.shape[d];
  return t.ndim == 0 ? 0 : n;
}

// What a result tensor says, comparable across calls (the data, not its address).
std::string describe(const moe_ep_tensor_t& t, bool with_contents = true) {
  std::string s = "ndim " + std::to_string(t.ndim) + " dtype " + std::to_string(t.dtype.code) + "/" +
                  std::to_string(t.dtype.bits) + " device " + std::to_string(t.device.device_type) + " data " +
                  (t.data ? "set" : "null") + " shape";
  for (int32_t d = 0; d < t.ndim; ++d) s += " " + std::to_string(t.shape[d]);
  if (t.data != nullptr && with_contents) {
    const auto* p = static_cast<const unsigned char*>(t.data) + t.byte_offset;
    const int64_t bytes = elements(t) * t.dtype.bits / 8;
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the contents
    for (int64_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
    s += " hash " + std::to_string(h);
  }
  return s;
}

// The tensors of a dispatch result in field order, with their end offsets.
std::vector<std::pair<size_t, const moe_ep_tensor_t*>> tensors_of(const moe_ep_dispatch_result_t& r) {
  using R = moe_ep_dispatch_result_t;
  return {{offsetof(R, hidden_states) + sizeof(moe_ep_tensor_t), &r.hidden_states},
          {offsetof(R, topk_ids) + sizeof(moe_ep_tensor_t), &r.topk_ids},
          {offsetof(R, topk_weights) + sizeof(moe_ep_tensor_t), &r.topk_weights},
          {offsetof(R, hidden_states_scale) + sizeof(moe_ep_tensor_t), &r.hidden_states_scale},
          {offsetof(R, recv_counts) + sizeof(moe_ep_tensor_t), &r.recv_counts},
          {offsetof(R, local_expert_counts) + sizeof(moe_ep_tensor_t), &r.local_expert_counts},
          {offsetof(R, eplb_gathered_stats) + sizeof(moe_ep_tensor_t), &r.eplb_gathered_stats},
          {offsetof(R, combine_input) + sizeof(moe_ep_tensor_t), &r.combine_input}};
}

// The dispatch result sizes to sweep: every valid one from the first released
// layout to 64 bytes past this library's, and some invalid ones.
std::vector<size_t> result_sizes(size_t first, size_t library) {
  std::vector<size_t> sizes;
  for (size_t s = first - 8; s <= library + 64; s += 4) sizes.push_back(s);
  return sizes;
}

void rank_body(int rank, int world, const moe_ep_bootstrap_t& b) {
  moe_ep_params_t p = moe_ep_test::make_params(2 * world, kTopK, kMaxTokens, kHidden);
  p.enable_eplb_stats = 1;
  p.scale_row_elems = 2;
  moe_ep_config_t c = moe_ep_test::host_config();
  c.zero_copy_combine = 1;
  moe_ep_handle_t h = nullptr;
  NEED(moe_ep_create(&b, &p, &c, &h) == MOE_EP_SUCCESS, "create");

  const int32_t tokens = 3 + rank;
  std::vector<uint16_t> hidden(static_cast<size_t>(tokens) * kHidden);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = static_cast<uint16_t>(0x3F80 + (i + rank * 7) % 64);
  std::vector<float> scales(static_cast<size_t>(tokens) * 2, 0.5f + rank);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t k = 0; k < kTopK; ++k) {
      ids.push_back((t * 3 + k + rank) % (2 * world));
      weights.push_back(0.25f * (k + 1));
    }
  }
  int64_t hidden_shape[2] = {tokens, kHidden}, pick_shape[2] = {tokens, kTopK}, scale_shape[2] = {tokens, 2};
  moe_ep_tensor_t hidden_t = cpu_tensor(hidden.data(), {MOE_EP_DTYPE_BFLOAT, 16, 1}, hidden_shape, 2);
  moe_ep_tensor_t ids_t = cpu_tensor(ids.data(), {MOE_EP_DTYPE_INT, 32, 1}, pick_shape, 2);
  moe_ep_tensor_t weights_t = cpu_tensor(weights.data(), {MOE_EP_DTYPE_FLOAT, 32, 1}, pick_shape, 2);
  moe_ep_tensor_t scales_t = cpu_tensor(scales.data(), {MOE_EP_DTYPE_FLOAT, 32, 1}, scale_shape, 2);
  moe_ep_dispatch_args_t args;
  moe_ep_dispatch_args_init(&args, sizeof args);
  args.hidden_states = &hidden_t;
  args.topk_ids = &ids_t;
  args.topk_weights = &weights_t;
  args.hidden_states_scale = &scales_t;

  const int64_t P = static_cast<int64_t>(world) * kMaxTokens;
  std::vector<uint16_t> expert(static_cast<size_t>(P) * kHidden);
  for (size_t i = 0; i < expert.size(); ++i) expert[i] = static_cast<uint16_t>(0x3E00 + (i * 5 + rank) % 128);
  int64_t expert_shape[2] = {P, kHidden};
  moe_ep_tensor_t expert_t = cpu_tensor(expert.data(), {MOE_EP_DTYPE_BFLOAT, 16, 1}, expert_shape, 2);

  // The reference: this library's own struct sizes.
  moe_ep_dispatch_result_t ref;
  moe_ep_dispatch_result_init(&ref, sizeof ref);
  NEED(moe_ep_dispatch(h, &args, &ref, nullptr) == MOE_EP_SUCCESS, "reference dispatch");
  std::vector<std::string> ref_tensors;
  // combine_input's contents are undefined after a dispatch: compare its view only.
  const auto describe_nth = [](size_t i, const moe_ep_tensor_t& t) { return describe(t, i != 7); };
  for (const auto& [end, t] : tensors_of(ref)) ref_tensors.push_back(describe_nth(ref_tensors.size(), *t));
  NEED(ref.combine_input.data != nullptr && ref.eplb_gathered_stats.data != nullptr, "every result present");
  moe_ep_combine_result_t ref_out;
  moe_ep_combine_result_init(&ref_out, sizeof ref_out);
  NEED(moe_ep_combine(h, &expert_t, nullptr, &ref_out, nullptr) == MOE_EP_SUCCESS, "reference combine");
  const std::string ref_output = describe(ref_out.output);

  using R = moe_ep_dispatch_result_t;
  using C = moe_ep_combine_result_t;
  const size_t first = moe_ep::first_released_size<R>();
  size_t valid_sizes = 0;
  for (size_t size : result_sizes(first, sizeof(R))) {
    const std::string ctx = "dispatch_result struct_size " + std::to_string(size);
    const bool valid = expected_valid<R>(size);
    Buffer buf(size);
    R* r = buf.as<R>();
    if (valid) {
      NEED(moe_ep_dispatch_result_init(r, size) == MOE_EP_SUCCESS, ctx);
    } else {
      const uint32_t s32 = static_cast<uint32_t>(size);
      std::memcpy(r, &s32, sizeof(s32));  // a caller that filled it by hand
    }
    const moe_ep_status_t s = moe_ep_dispatch(h, &args, r, nullptr);
    NEED(buf.canary_damage() == -1, ctx);
    if (!valid) {
      NEED(s == MOE_EP_ERROR_INVALID_ARGUMENT, ctx);
      NEED(std::string(moe_ep_last_error()).find("result->struct_size") != std::string::npos, ctx);
      NEED(buf.first_not(4, size, kCanary) == -1, ctx + ": nothing written");
      continue;  // every rank refused it before any exchange
    }
    NEED(s == MOE_EP_SUCCESS, ctx);
    NEED(buf.struct_size() == size, ctx + ": struct_size kept");
    NEED(r->tokens_per_rank == ref.tokens_per_rank, ctx);
    size_t i = 0;
    for (const auto& [end, t] : tensors_of(*r)) {
      if (end <= size) NEED(describe_nth(i, *t) == ref_tensors[i], ctx + ": tensor " + std::to_string(i));
      ++i;
    }
    NEED(buf.first_not(sizeof(R), size, 0) == -1, ctx + ": a newer caller's tail reads as absent");

    // Combine, with the combine result at sizes around its own, valid and not.
    const size_t csize = sizeof(C) + 4 * (valid_sizes++ % 5);
    const std::string cctx = ctx + ", combine_result struct_size " + std::to_string(csize);
    Buffer cbuf(csize);
    C* cr = cbuf.as<C>();
    const bool cvalid = expected_valid<C>(csize);
    if (cvalid) {
      NEED(moe_ep_combine_result_init(cr, csize) == MOE_EP_SUCCESS, cctx);
    } else {
      const uint32_t s32 = static_cast<uint32_t>(csize);
      std::memcpy(cr, &s32, sizeof(s32));
    }
    const moe_ep_status_t cs = moe_ep_combine(h, &expert_t, nullptr, cr, nullptr);
    NEED(cbuf.canary_damage() == -1, cctx);
    if (!cvalid) {
      NEED(cs == MOE_EP_ERROR_INVALID_ARGUMENT, cctx);
      NEED(cbuf.first_not(4, csize, kCanary) == -1, cctx + ": nothing written");
      moe_ep_combine_result_t fine;
      moe_ep_combine_result_init(&fine, sizeof fine);
      NEED(moe_ep_combine(h, &expert_t, nullptr, &fine, nullptr) == MOE_EP_SUCCESS, cctx + ": then a valid one");
      NEED(describe(fine.output) == ref_output, cctx);
      continue;
    }
    NEED(cs == MOE_EP_SUCCESS, cctx);
    NEED(cbuf.struct_size() == csize, cctx);
    NEED(describe(cr->output) == ref_output, cctx);
    NEED(cbuf.first_not(sizeof(C), csize, 0) == -1, cctx);
  }
  NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS, "destroy");
}

}  // namespace

TEST_CASE("dispatch and combine write their results up to the caller's struct_size only", "[versioning][host]") {
  for (int world : {1, 2, 3}) {
    INFO("world " << world);
    CHECK_NOTHROW(
        moe_ep_test::run_ranks(world, [&](int rank, const moe_ep_bootstrap_t& b) { rank_body(rank, world, b); }));
  }
}

TEST_CASE("an older caller's dispatch result: combine_input is never written", "[versioning][host]") {
  // Spelled out for the one grown output struct: a 0.1 result ends before
  // combine_input, so the canary sits exactly where combine_input would be.
  moe_ep_test::run_ranks(1, [&](int, const moe_ep_bootstrap_t& b) {
    const moe_ep_params_t p = moe_ep_test::make_params(2, 1, 2, 4);
    moe_ep_config_t c = moe_ep_test::host_config();
    c.zero_copy_combine = 1;
    moe_ep_handle_t h = nullptr;
    NEED(moe_ep_create(&b, &p, &c, &h) == MOE_EP_SUCCESS, "create");
    std::vector<uint16_t> hidden(4, 0x3F80);
    std::vector<int32_t> ids{0};
    int64_t hs[2] = {1, 4}, is[2] = {1, 1};
    moe_ep_tensor_t ht = cpu_tensor(hidden.data(), {MOE_EP_DTYPE_BFLOAT, 16, 1}, hs, 2);
    moe_ep_tensor_t it = cpu_tensor(ids.data(), {MOE_EP_DTYPE_INT, 32, 1}, is, 2);
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a, sizeof a);
    a.hidden_states = &ht;
    a.topk_ids = &it;
    const size_t old = offsetof(moe_ep_dispatch_result_t, combine_input);
    Buffer buf(old);
    NEED(moe_ep_dispatch_result_init(buf.as<moe_ep_dispatch_result_t>(), old) == MOE_EP_SUCCESS, "init");
    NEED(moe_ep_dispatch(h, &a, buf.as<moe_ep_dispatch_result_t>(), nullptr) == MOE_EP_SUCCESS, "dispatch");
    NEED(buf.canary_damage() == -1, "combine_input's bytes");
    NEED(buf.as<moe_ep_dispatch_result_t>()->hidden_states.data != nullptr, "older fields written");
    std::vector<uint16_t> expert(2 * 4, 0);
    int64_t es[2] = {2, 4};
    moe_ep_tensor_t et = cpu_tensor(expert.data(), {MOE_EP_DTYPE_BFLOAT, 16, 1}, es, 2);
    moe_ep_combine_result_t cr;
    moe_ep_combine_result_init(&cr, sizeof cr);
    NEED(moe_ep_combine(h, &et, nullptr, &cr, nullptr) == MOE_EP_SUCCESS, "combine");
    NEED(moe_ep_destroy(&h) == MOE_EP_SUCCESS, "destroy");
  });
}
