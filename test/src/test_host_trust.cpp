// Trust and bounded waits on the HOST backend: what peers send is checked
// before use (INVALID_INPUT naming the peer and both values, never an
// out-of-bounds access: run under ASan in the sanitizer suite), sizes never
// wrap, and timeout_ms bounds every wait for a peer.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "common/host_identity.hpp"
#include "dtypes.hpp"
#include "moe_ep_c.h"
#include "rank_checks.hpp"
#include "tensor_view.hpp"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

#if defined(__SANITIZE_ADDRESS__)
#define MOE_EP_TEST_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_EP_TEST_UNDER_ASAN 1
#endif
#endif
#ifndef MOE_EP_TEST_UNDER_ASAN
#define MOE_EP_TEST_UNDER_ASAN 0
#endif

using Catch::Matchers::Contains;
using namespace moe_ep_test;
using namespace moe_ep_verify;

namespace {

// The HOST backend's first exchange of a dispatch is one 32-byte header per
// rank: u64 sequence, u64 record_bytes, i32 tokens_per_rank, i32 num_tokens,
// i32 has_weights, i32 reserved (src/host_backend.cpp).  Create's agreement
// on every rank's outcome is one 248-byte record: i32 status, char[244] message.
constexpr size_t kHeaderBytes = 32;
constexpr size_t kHeaderTokensPerRank = 16, kHeaderNumTokens = 20, kHeaderHasWeights = 24;
constexpr size_t kOutcomeBytes = 248;

int32_t read_i32(const void* base, size_t offset) {
  int32_t v;
  std::memcpy(&v, static_cast<const char*>(base) + offset, sizeof(v));
  return v;
}
void write_i32(void* base, size_t offset, int32_t v) { std::memcpy(static_cast<char*>(base) + offset, &v, sizeof(v)); }

using Clock = std::chrono::steady_clock;
int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

struct Outcome {
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
};

// A 2-expert-per-rank group with rows of 8 fp32 values and weights.
struct Rank {
  static constexpr int32_t kMaxTokens = 4, kHidden = 8, kTopK = 2;
  moe_ep_handle_t h = nullptr;
  std::vector<float> hidden;
  std::vector<int32_t> ids;
  std::vector<float> weights;

  moe_ep_status_t create(const moe_ep_bootstrap_t& b, int32_t timeout_ms) {
    moe_ep_params_t p = make_params(2 * b.world_size, kTopK, kMaxTokens, kHidden);
    p.hidden_dtype = fp32_dtype();
    p.combine_dtype = fp32_dtype();
    moe_ep_config_t c = host_config();
    c.timeout_ms = timeout_ms;
    return moe_ep_create(&b, &p, &c, &h);
  }

  Outcome dispatch(int32_t tokens, int32_t runtime_max = 0) {
    hidden.assign(static_cast<size_t>(tokens) * kHidden, 1.0f);
    ids.assign(static_cast<size_t>(tokens) * kTopK, 0);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 2);
    weights.assign(ids.size(), 0.5f);
    TensorView x(hidden.data(), fp32_dtype(), {tokens, kHidden});
    TensorView i(ids.data(), int32_dtype(), {tokens, kTopK});
    TensorView w(weights.data(), fp32_dtype(), {tokens, kTopK});
    moe_ep_dispatch_args_t a;
    moe_ep_dispatch_args_init(&a, sizeof a);
    a.hidden_states = x.get();
    a.topk_ids = i.get();
    a.topk_weights = w.get();
    a.runtime_max_tokens_per_rank = runtime_max;
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    Outcome o;
    o.status = moe_ep_dispatch(h, &a, &r, nullptr);
    o.message = moe_ep_last_error();
    last_tpr = r.tokens_per_rank;
    return o;
  }

  Outcome combine(int world) {
    std::vector<float> eo(static_cast<size_t>(world) * last_tpr * kHidden, 1.0f);
    TensorView e(eo.data(), fp32_dtype(), {world * last_tpr, kHidden});
    moe_ep_combine_result_t r;
    moe_ep_combine_result_init(&r, sizeof r);
    Outcome o;
    o.status = moe_ep_combine(h, e.get(), nullptr, &r, nullptr);
    o.message = moe_ep_last_error();
    return o;
  }

  int32_t last_tpr = 0;
};

// A tamper that rewrites the first dispatch header exchange seen by every rank.
Tamper on_first_header(std::function<void(void* headers)> rewrite) {
  auto done = std::make_shared<std::vector<int>>(8, 0);
  auto m = std::make_shared<std::mutex>();
  return [=](int rank, int64_t, void* recv, size_t bytes) {
    if (bytes != kHeaderBytes) return;
    std::lock_guard<std::mutex> lock(*m);
    if ((*done)[rank]++ != 0) return;
    rewrite(recv);
  };
}

// Two ranks dispatch 3 tokens each once under `tamper`; what each rank got.
std::vector<Outcome> dispatch_under(const Tamper& tamper) {
  std::vector<Outcome> got(2);
  RankChecks checks;
  run_ranks(
      2,
      [&](int rank, const moe_ep_bootstrap_t& b) {
        Rank r;
        RANK_REQUIRE(checks, rank, r.create(b, 5000) == MOE_EP_SUCCESS);
        got[rank] = r.dispatch(3);
        moe_ep_destroy(&r.h);
      },
      tamper);
  checks.assert_all();
  return got;
}

// Two ranks create a handle, rank 1 with top_k 0 (it fails), under `tamper`;
// what each rank got.  With `checks`, each rank also records that it was left
// without a handle.
std::vector<Outcome> create_failing_on_rank1(const Tamper& tamper, RankChecks* checks = nullptr) {
  std::vector<Outcome> got(2);
  run_ranks(
      2,
      [&](int rank, const moe_ep_bootstrap_t& b) {
        moe_ep_params_t p = make_params(4, rank == 1 ? 0 : 2, 4, 8);
        moe_ep_config_t c = host_config();
        moe_ep_handle_t h = nullptr;
        got[rank].status = moe_ep_create(&b, &p, &c, &h);
        got[rank].message = moe_ep_last_error();
        if (checks) RANK_CHECK(*checks, rank, h == nullptr);
      },
      tamper);
  return got;
}

}  // namespace

TEST_CASE("peer data: runtime_max_tokens_per_rank that differs between ranks is INVALID_INPUT on every rank",
          "[trust]") {
  std::vector<Outcome> first(2), second(2);
  RankChecks checks;
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    Rank r;
    RANK_REQUIRE(checks, rank, r.create(b, 5000) == MOE_EP_SUCCESS);
    first[rank] = r.dispatch(2, rank == 0 ? 4 : 3);
    // Nothing moved and the group is still in step: a consistent round works.
    second[rank] = r.dispatch(2, 3);
    if (second[rank].status == MOE_EP_SUCCESS) second[rank] = r.combine(2);
    moe_ep_destroy(&r.h);
  });
  checks.assert_all();
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << first[rank].message);
    CHECK(first[rank].status == MOE_EP_ERROR_INVALID_INPUT);
    CHECK_THAT(first[rank].message, Contains("rank " + std::to_string(1 - rank)) && Contains("tokens_per_rank") &&
                                        Contains(rank == 0 ? "3" : "4") && Contains(rank == 0 ? "this rank 4" : "this rank 3"));
    CHECK(second[rank].status == MOE_EP_SUCCESS);
  }
}

TEST_CASE("peer data: a hostile bootstrap's counts and records are checked before use", "[trust]") {
  struct Corruption {
    const char* what;
    Tamper tamper;
    std::vector<std::string> expected;
  };
  const std::vector<Corruption> cases = {
      {"num_tokens far beyond tokens_per_rank",
       on_first_header([](void* h) { write_i32(h, kHeaderBytes + kHeaderNumTokens, 1 << 30); }),
       {"rank 1", "num_tokens 1073741824", "[0, tokens_per_rank = 4]"}},
      {"negative num_tokens",
       on_first_header([](void* h) { write_i32(h, kHeaderBytes + kHeaderNumTokens, -5); }),
       {"rank 1", "num_tokens -5"}},
      {"has_weights not a flag",
       on_first_header([](void* h) { write_i32(h, kHeaderBytes + kHeaderHasWeights, 77); }),
       {"rank 1", "has_weights 77"}},
      {"tokens_per_rank beyond max_tokens_per_rank",
       on_first_header([](void* h) { write_i32(h, kHeaderBytes + kHeaderTokensPerRank, 1 << 20); }),
       {"rank 1", "tokens_per_rank 1048576", "this rank 4"}},
      {"record size",
       on_first_header([](void* h) {
         uint64_t huge = ~uint64_t{0};
         std::memcpy(static_cast<char*>(h) + kHeaderBytes + 8, &huge, sizeof(huge));
       }),
       {"rank 1", "records of 18446744073709551615 bytes"}},
  };
  for (const Corruption& c : cases) {
    const std::vector<Outcome> got = dispatch_under(c.tamper);
    for (int rank = 0; rank < 2; ++rank) {
      INFO(c.what << ", rank " << rank << ": " << got[rank].message);
      CHECK(got[rank].status == MOE_EP_ERROR_INVALID_INPUT);
      for (const auto& part : c.expected) CHECK_THAT(got[rank].message, Contains(part));
    }
  }
}

TEST_CASE("peer data: a record that does not match its header is rejected", "[trust]") {
  auto seen_header = std::make_shared<std::vector<int>>(2, 0);
  auto m = std::make_shared<std::mutex>();
  const std::vector<Outcome> got = dispatch_under([=](int rank, int64_t, void* recv, size_t bytes) {
    std::lock_guard<std::mutex> lock(*m);
    if (bytes == kHeaderBytes) {
      (*seen_header)[rank] = 1;
    } else if ((*seen_header)[rank] == 1) {  // the records right after the headers
      (*seen_header)[rank] = 2;
      write_i32(recv, bytes + 8, 1);  // rank 1's stamp: num_tokens 1 instead of 3
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank << ": " << got[rank].message);
    CHECK(got[rank].status == MOE_EP_ERROR_INVALID_INPUT);
    CHECK_THAT(got[rank].message, Contains("rank 1's record") && Contains("does not match its header"));
  }
}

TEST_CASE("peer data: a peer's failure message is read within its field", "[trust]") {
  SECTION("no terminating NUL") {
    RankChecks checks;
    const std::vector<Outcome> got = create_failing_on_rank1(
        [](int rank, int64_t, void* recv, size_t bytes) {
          if (rank != 0 || bytes != kOutcomeBytes) return;
          std::memset(static_cast<char*>(recv) + kOutcomeBytes + 4, 'A', kOutcomeBytes - 4);
        },
        &checks);
    checks.assert_all();
    INFO(got[0].message);
    CHECK(got[0].status == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(got[0].message, Contains("rank 1 failed: AAAA"));
    CHECK(got[0].message.size() < 300);
    CHECK(got[1].status == MOE_EP_ERROR_INVALID_ARGUMENT);
  }
  SECTION("control characters and bytes outside ASCII are replaced") {
    const std::vector<Outcome> got = create_failing_on_rank1([](int rank, int64_t, void* recv, size_t bytes) {
      if (rank != 0 || bytes != kOutcomeBytes) return;
      char* text = static_cast<char*>(recv) + kOutcomeBytes + 4;
      const char hostile[] = {'\n', '\x1b', '[', '2', 'J', '\r', '\x7f', '\xff', 'o', 'k'};
      for (size_t i = 0; i < kOutcomeBytes - 4; ++i) text[i] = hostile[i % sizeof(hostile)];  // and no NUL
    });
    INFO(got[0].message);
    CHECK(got[0].status == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(got[0].message, Contains("rank 1 failed: ??[2J???ok"));
    for (char ch : got[0].message) {
      const auto u = static_cast<unsigned char>(ch);
      CHECK((u >= 0x20 && u < 0x7f));
    }
    CHECK(got[0].message.size() < 300);
  }
  SECTION("a status that is not a moe_ep status") {
    const std::vector<Outcome> got = create_failing_on_rank1([](int rank, int64_t, void* recv, size_t bytes) {
      if (rank == 0 && bytes == kOutcomeBytes) write_i32(recv, kOutcomeBytes, 777);
    });
    CHECK(got[0].status == MOE_EP_ERROR_INVALID_INPUT);
    CHECK_THAT(got[0].message, Contains("rank 1") && Contains("unknown status 777"));
  }
}

TEST_CASE("timeout_ms: a rank that never dispatches costs its peer timeout_ms, then the handle is unusable",
          "[trust][timeout]") {
  constexpr int32_t kTimeoutMs = 300;
  constexpr int64_t kSlackMs = 1500;  // scheduling on a loaded 2-core CI machine, sanitizers
  Outcome first, later, async;
  int64_t waited = 0, destroy_ms = 0;
  std::atomic<bool> rank0_done{false};
  RankChecks checks;
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    Rank r;
    RANK_REQUIRE(checks, rank, r.create(b, kTimeoutMs) == MOE_EP_SUCCESS);
    if (rank == 0) {
      const auto t0 = Clock::now();
      first = r.dispatch(2);
      waited = ms_since(t0);
      later = r.dispatch(2);
      moe_ep_status_t s = MOE_EP_SUCCESS;
      RANK_REQUIRE(checks, rank, moe_ep_get_async_error(r.h, &s) == MOE_EP_SUCCESS);
      async.status = s;
      const auto t1 = Clock::now();
      RANK_CHECK(checks, rank, moe_ep_destroy(&r.h) == MOE_EP_SUCCESS);
      destroy_ms = ms_since(t1);
      RANK_CHECK(checks, rank, r.h == nullptr);
      rank0_done = true;
    } else {
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // never dispatches
      RANK_CHECK(checks, rank, moe_ep_destroy(&r.h) == MOE_EP_SUCCESS);
    }
  });
  checks.assert_all();
  INFO(first.message);
  CHECK(first.status == MOE_EP_ERROR_TIMEOUT);
  CHECK_THAT(first.message, Contains("HOST dispatch: headers") && Contains("rank 0") && Contains("timeout_ms = 300"));
  CHECK(waited >= kTimeoutMs - 5);
  CHECK(waited <= kTimeoutMs + kSlackMs);
  CHECK(later.status == MOE_EP_ERROR_TIMEOUT);
  CHECK(async.status == MOE_EP_ERROR_TIMEOUT);
  CHECK(destroy_ms < 500);
}

TEST_CASE("timeout_ms: a rank that never combines, or never creates, costs its peer timeout_ms", "[trust][timeout]") {
  constexpr int32_t kTimeoutMs = 200;
  SECTION("combine") {
    Outcome got;
    int64_t waited = 0;
    std::atomic<bool> rank0_done{false};
    RankChecks checks;
    run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
      Rank r;
      RANK_REQUIRE(checks, rank, r.create(b, kTimeoutMs) == MOE_EP_SUCCESS);
      RANK_REQUIRE(checks, rank, r.dispatch(1).status == MOE_EP_SUCCESS);
      if (rank == 0) {
        const auto t0 = Clock::now();
        got = r.combine(2);
        waited = ms_since(t0);
        rank0_done = true;
      } else {
        while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      RANK_CHECK(checks, rank, moe_ep_destroy(&r.h) == MOE_EP_SUCCESS);
    });
    checks.assert_all();
    CHECK(got.status == MOE_EP_ERROR_TIMEOUT);
    CHECK_THAT(got.message, Contains("HOST combine"));
    CHECK(waited <= kTimeoutMs + 1500);
  }
  SECTION("create") {
    Outcome got;
    moe_ep_handle_t h = reinterpret_cast<moe_ep_handle_t>(1);
    RankChecks checks;
    run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
      if (rank == 1) return;  // never calls create
      Rank r;
      const auto t0 = Clock::now();
      got.status = r.create(b, kTimeoutMs);
      got.message = moe_ep_last_error();
      RANK_CHECK(checks, rank, ms_since(t0) <= kTimeoutMs + 1500);
      h = r.h;
    });
    checks.assert_all();
    CHECK(got.status == MOE_EP_ERROR_TIMEOUT);
    CHECK(h == nullptr);
  }
}

namespace {
// Bytes of address space this process maps now (VmSize).
rlim_t address_space_in_use() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmSize:") {
      rlim_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(4096, '\n');
  }
  return rlim_t{1} << 36;
}
}  // namespace

TEST_CASE("sizes: huge params are INVALID_ARGUMENT or OUT_OF_MEMORY, never a wrapped size", "[trust]") {
  moe_ep_config_t c = host_config();
  uint64_t bytes = 0;
  SECTION("a workspace beyond the limit") {
    moe_ep_params_t p = make_params(4096, 128, 1 << 20, 65536);  // every limit at once
    p.hidden_dtype = fp32_dtype();
    p.combine_dtype = fp32_dtype();
    CHECK(moe_ep_workspace_size(&p, &c, 4096, &bytes) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_ep_last_error()), Contains("params") && Contains("bytes per rank"));
    CHECK(bytes == 0);
  }
  SECTION("a large but representable workspace is reported exactly") {
    moe_ep_params_t p = make_params(8, 1, 1 << 20, 1024);  // bf16
    REQUIRE(moe_ep_workspace_size(&p, &c, 8, &bytes) == MOE_EP_SUCCESS);
    const uint64_t rows = 8ull << 20;
    CHECK(bytes == rows * (2048 + 8) + 4 * (8 + 1) + (1ull << 20) * 2048);
  }
  SECTION("create: overflow is INVALID_ARGUMENT, a failed allocation OUT_OF_MEMORY") {
    const moe_ep_bootstrap_t b = single_rank_bootstrap();
    moe_ep_handle_t h = nullptr;
    moe_ep_params_t huge = make_params(1 << 30, 8, INT32_MAX, (1 << 29) - 1);
    CHECK(moe_ep_create(&b, &huge, &c, &h) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK(h == nullptr);
#if !MOE_EP_TEST_UNDER_ASAN  // ASan reports a failed operator new as fatal instead of throwing bad_alloc
    // Within the limits (8 GiB of rows) but above an address-space limit
    // set for the call, so the allocation fails on any machine.
    moe_ep_params_t big = make_params(8, 1, 1 << 20, 4096);
    rlimit saved{};
    REQUIRE(getrlimit(RLIMIT_AS, &saved) == 0);
    rlimit tight = saved;
    tight.rlim_cur = address_space_in_use() + (rlim_t{2} << 30);
    if (saved.rlim_cur != RLIM_INFINITY && saved.rlim_cur < tight.rlim_cur) tight.rlim_cur = saved.rlim_cur;
    REQUIRE(setrlimit(RLIMIT_AS, &tight) == 0);
    const moe_ep_status_t s = moe_ep_create(&b, &big, &c, &h);
    REQUIRE(setrlimit(RLIMIT_AS, &saved) == 0);
    INFO(moe_ep_last_error());
    CHECK(s == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(h == nullptr);
#endif
  }
}

TEST_CASE("tensors: data + byte_offset must not wrap and must be aligned", "[trust]") {
  const moe_ep_bootstrap_t b = single_rank_bootstrap();
  Rank r;
  REQUIRE(r.create(b, 1000) == MOE_EP_SUCCESS);
  std::vector<float> hidden(2 * Rank::kHidden, 1.0f);
  std::vector<int32_t> ids(2 * Rank::kTopK + 1, 0);
  TensorView x(hidden.data(), fp32_dtype(), {2, Rank::kHidden});
  TensorView i(ids.data(), int32_dtype(), {2, Rank::kTopK});
  moe_ep_dispatch_args_t a;
  moe_ep_dispatch_args_init(&a, sizeof a);
  a.hidden_states = x.get();
  a.topk_ids = i.get();
  moe_ep_dispatch_result_t res;
  moe_ep_dispatch_result_init(&res, sizeof res);
  SECTION("wrap-around") {
    i.raw().byte_offset = ~uint64_t{0} - 3;
    CHECK(moe_ep_dispatch(r.h, &a, &res, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_ep_last_error()), Contains("args->topk_ids->byte_offset"));
  }
  SECTION("misaligned int32") {
    i.raw().byte_offset = 2;
    CHECK(moe_ep_dispatch(r.h, &a, &res, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_ep_last_error()), Contains("args->topk_ids") && Contains("aligned to 4 bytes"));
  }
  SECTION("args.struct_size = 12 cuts a pointer: rejected, the handle stays usable") {
    a.struct_size = 12;
    CHECK(moe_ep_dispatch(r.h, &a, &res, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(std::string(moe_ep_last_error()), Contains("args->struct_size") && Contains("got 12"));
    a.struct_size = 0xFFFFFFFFu;
    CHECK(moe_ep_dispatch(r.h, &a, &res, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
    a.struct_size = sizeof(a);
  }
  i.raw().byte_offset = 0;
  CHECK(moe_ep_dispatch(r.h, &a, &res, nullptr) == MOE_EP_SUCCESS);
  moe_ep_destroy(&r.h);
}

TEST_CASE("peer data: a peer's host record is read within its fields and printed without control characters",
          "[trust]") {
  // On the heap, exactly sized: a read past a field is a heap-buffer-overflow
  // under ASan (the sanitizer suite), not a silent read of the next field.
  auto peer = std::make_unique<moe_ep::HostIdentity>();
  std::memset(peer->hostname, 'h', sizeof(peer->hostname));  // no NUL anywhere
  std::memset(peer->boot_id, '\n', sizeof(peer->boot_id));
  peer->boot_id[0] = '\x1b';
  const std::string text = moe_ep::describe_host(*peer);
  CHECK(text == std::string(sizeof(peer->hostname), 'h') + " (boot " + std::string(sizeof(peer->boot_id), '?') + ")");
  std::memset(peer->boot_id, 0, sizeof(peer->boot_id));
  CHECK(moe_ep::describe_host(*peer) == std::string(sizeof(peer->hostname), 'h') + " (boot unknown)");
  const char bus_id[4] = {'0', '\a', 'x', 'y'};  // a PCI bus id field of 4 bytes, unterminated
  CHECK(moe_ep::peer_text(bus_id, sizeof(bus_id)) == "0?xy");
}

namespace {

// Wraps one rank's bootstrap: once armed, `script` runs before each of this
// rank's allgathers (on whatever thread calls it) and says whether to forward
// it and what to return afterwards; a non-zero return leaves a message.
struct Scripted {
  moe_ep_bootstrap_t inner{};
  std::function<int32_t(int64_t call, size_t bytes, bool* forward)> script;
  std::atomic<bool> armed{false};
  std::atomic<int64_t> calls{0};
  std::atomic<int> inside{0};  // callbacks running in this object now

  // A handle's abandoned thread may still be in a callback after the rank
  // returned: the test waits for it before its locals go.
  static void wait_until_left(const Scripted* all, int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    for (int r = 0; r < n; ++r) {
      while (all[r].inside.load() != 0 && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes) {
    auto* self = static_cast<Scripted*>(ctx);
    struct Inside {
      std::atomic<int>& n;
      explicit Inside(std::atomic<int>& c) : n(c) { ++n; }
      ~Inside() { --n; }
    } inside(self->inside);
    bool forward = true;
    const int32_t rc = self->armed ? self->script(self->calls++, bytes, &forward) : 0;
    if (forward) {
      const int32_t inner_rc = self->inner.allgather(self->inner.ctx, send, recv, bytes);
      if (inner_rc != 0) return inner_rc;
    }
    if (rc != 0) moe_ep_set_last_error("test bootstrap: the transport went away");
    return rc;
  }
  static int32_t barrier(void* ctx) {
    auto* self = static_cast<Scripted*>(ctx);
    return self->inner.barrier(self->inner.ctx);
  }
  moe_ep_bootstrap_t view() {
    moe_ep_bootstrap_t b = inner;
    b.ctx = this;
    b.allgather = &Scripted::allgather;
    b.barrier = &Scripted::barrier;
    return b;
  }
};

}  // namespace

TEST_CASE("timeout_ms: a peer that sent its dispatch header, then stops, costs timeout_ms in the record exchange",
          "[trust][timeout]") {
  constexpr int32_t kTimeoutMs = 300;
  Outcome got;
  int64_t waited = 0;
  std::atomic<bool> rank0_done{false};
  Scripted scripts[2];
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    Scripted& s = scripts[rank];  // outlives the rank: an abandoned callback may still run in it
    s.inner = b;
    s.script = [&](int64_t call, size_t, bool* forward) -> int32_t {
      if (call == 0) return 0;  // the header goes through
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      *forward = false;  // the records never do
      return -1;
    };
    const moe_ep_bootstrap_t viewed = s.view();
    Rank r;
    if (r.create(viewed, kTimeoutMs) != MOE_EP_SUCCESS) {
      got.message = "create failed on rank " + std::to_string(rank);
      rank0_done = true;
      return;
    }
    if (rank == 1) s.armed = true;
    const auto t0 = Clock::now();
    const Outcome o = r.dispatch(2);
    if (rank == 0) {
      waited = ms_since(t0);
      got = o;
      rank0_done = true;
    }
    moe_ep_destroy(&r.h);
  });
  Scripted::wait_until_left(scripts, 2);
  INFO(got.message);
  CHECK(got.status == MOE_EP_ERROR_TIMEOUT);
  CHECK_THAT(got.message, Contains("HOST dispatch: token records") && Contains("timeout_ms = 300"));
  CHECK(waited >= kTimeoutMs - 5);
  CHECK(waited <= kTimeoutMs + 1500);
}

TEST_CASE(
    "timeout_ms: a peer late in both exchanges of a dispatch, each within the bound, costs up to twice timeout_ms",
    "[trust][timeout]") {
  constexpr int32_t kTimeoutMs = 500;
  constexpr int kLateMs = 350;  // per exchange: within the bound, but twice that is beyond it
  std::vector<Outcome> got(2);
  int64_t waited = 0;
  Scripted scripts[2];
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    Scripted& s = scripts[rank];  // outlives the rank: an abandoned callback may still run in it
    s.inner = b;
    s.script = [&](int64_t, size_t, bool*) -> int32_t {
      std::this_thread::sleep_for(std::chrono::milliseconds(kLateMs));
      return 0;
    };
    const moe_ep_bootstrap_t viewed = s.view();
    Rank r;
    if (r.create(viewed, kTimeoutMs) != MOE_EP_SUCCESS) return;
    if (rank == 1) s.armed = true;
    const auto t0 = Clock::now();
    got[rank] = r.dispatch(2);
    if (rank == 0) waited = ms_since(t0);
    moe_ep_destroy(&r.h);
  });
  Scripted::wait_until_left(scripts, 2);
  INFO(got[0].message << " / " << got[1].message);
  CHECK(got[0].status == MOE_EP_SUCCESS);  // each exchange met the bound
  CHECK(got[1].status == MOE_EP_SUCCESS);
  CHECK(waited >= 2 * kLateMs - 20);  // more than one timeout_ms in all
  CHECK(waited > kTimeoutMs);
  CHECK(waited <= 2 * kTimeoutMs + 1500);
}

TEST_CASE("bootstrap: a callback that fails during a HOST dispatch or combine is BOOTSTRAP, and every rank returns",
          "[trust][timeout]") {
  constexpr int32_t kTimeoutMs = 300;
  for (const bool in_combine : {false, true}) {
    std::vector<Outcome> got(2);
    std::vector<int64_t> waited(2, 0), destroy_ms(2, 0);
    std::vector<bool> created(2, false);
    Scripted scripts[2];
    run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
      Scripted& s = scripts[rank];
      s.inner = b;
      s.script = [](int64_t call, size_t, bool*) -> int32_t { return call == 0 ? -1 : 0; };  // delivers, then fails
      const moe_ep_bootstrap_t viewed = s.view();
      Rank r;
      created[rank] = r.create(viewed, kTimeoutMs) == MOE_EP_SUCCESS;
      if (!created[rank]) return;
      if (in_combine && r.dispatch(1).status != MOE_EP_SUCCESS) return;
      if (rank == 1) s.armed = true;
      const auto t0 = Clock::now();
      got[rank] = in_combine ? r.combine(2) : r.dispatch(2);
      waited[rank] = ms_since(t0);
      const auto t1 = Clock::now();
      moe_ep_destroy(&r.h);
      destroy_ms[rank] = ms_since(t1);
    });
    Scripted::wait_until_left(scripts, 2);
    INFO((in_combine ? "combine" : "dispatch") << ": rank 0: " << got[0].message << " / rank 1: " << got[1].message);
    REQUIRE(created[0]);
    REQUIRE(created[1]);
    CHECK(got[1].status == MOE_EP_ERROR_BOOTSTRAP);
    CHECK_THAT(got[1].message, Contains("returned -1 on rank 1: test bootstrap: the transport went away") &&
                                   Contains(in_combine ? "HOST combine" : "HOST dispatch: headers"));
    for (int r = 0; r < 2; ++r) {
      CHECK(waited[r] <= kTimeoutMs + 1500);  // rank 0 may succeed or time out, but returns
      CHECK(destroy_ms[r] < 500);
    }
  }
}

#if !MOE_EP_TEST_UNDER_ASAN  // ASan owns operator new
namespace {
// Allocations above this many bytes fail on the thread that set it (0: none).
thread_local size_t t_refuse_above = 0;
}  // namespace

void* operator new(size_t n) {
  if (t_refuse_above != 0 && n > t_refuse_above) throw std::bad_alloc();
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

TEST_CASE("create: OUT_OF_MEMORY on one rank is agreed on every rank", "[trust]") {
  constexpr int kWorld = 3;
  std::vector<Outcome> got(kWorld);
  std::vector<bool> no_handle(kWorld, false);
  run_ranks(kWorld, [&](int rank, const moe_ep_bootstrap_t& b) {
    // 192 receive rows of 4 KiB: the receive buffer (768 KiB) fails on rank 1.
    moe_ep_params_t p = make_params(2 * kWorld, 2, 64, 1024);
    p.hidden_dtype = fp32_dtype();
    p.combine_dtype = fp32_dtype();
    moe_ep_config_t c = host_config();
    c.timeout_ms = 5000;
    moe_ep_handle_t h = nullptr;
    if (rank == 1) t_refuse_above = 256 << 10;
    got[rank].status = moe_ep_create(&b, &p, &c, &h);
    t_refuse_above = 0;
    got[rank].message = moe_ep_last_error();
    no_handle[rank] = h == nullptr;
    if (h != nullptr) moe_ep_destroy(&h);
  });
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << got[r].message);
    CHECK(got[r].status == MOE_EP_ERROR_OUT_OF_MEMORY);
    CHECK(no_handle[r]);
    if (r != 1) CHECK_THAT(got[r].message, Contains("rank 1 failed"));
  }
}
#endif

TEST_CASE("peer data: random and hostile records from a peer are refused or used within bounds, never a crash",
          "[trust][peer_fuzz]") {
  // A multi-rank fuzzer with a fixed seed: two ranks as threads, and every
  // rank receives the same corrupted copy of rank 1's contribution to one
  // exchange of a dispatch + combine (the headers, the token records or the
  // expert outputs): random bytes at random places, a field set to an extreme,
  // or the whole slot random.  Every call must return a moe_ep status (run
  // under ASan and UBSan in the sanitizer suite: no access out of bounds).
  constexpr int kIterations = 400;
  constexpr int32_t kTimeoutMs = 150;  // a rank that accepted what its peer refused waits this long
  std::mt19937_64 seeds(20240601);
  int refused = 0, ok = 0;
  std::string unexpected;
  for (int iter = 0; iter < kIterations; ++iter) {
    const uint64_t seed = seeds();
    const int target = static_cast<int>(seed % 3);  // 0 headers, 1 records, 2 expert outputs
    std::vector<Outcome> got(2);
    std::vector<int> stage(2, -1);  // per rank: -1 before the first header, then 0, 1, 2 ...
    Tamper tamper = [&, seed, target](int rank, int64_t, void* recv, size_t bytes) {
      if (bytes == kHeaderBytes && stage[rank] < 0)
        stage[rank] = 0;
      else if (stage[rank] >= 0)
        ++stage[rank];
      if (stage[rank] != target) return;
      unsigned char* slot = static_cast<unsigned char*>(recv) + bytes;  // rank 1's part
      std::mt19937_64 g(seed);                                          // the same corruption on every rank
      switch (g() % 3) {
        case 0:
          for (int i = 0, n = 1 + static_cast<int>(g() % 8); i < n && bytes > 0; ++i) slot[g() % bytes] = g();
          break;
        case 1:
          if (bytes >= 4) {
            const int32_t extremes[] = {INT32_MIN, -1, 0, 1, 4, 5, INT32_MAX};
            write_i32(slot, (g() % (bytes / 4)) * 4, extremes[g() % 7]);
          }
          break;
        default:
          for (size_t i = 0; i < bytes; ++i) slot[i] = g();
      }
    };
    run_ranks(
        2,
        [&](int rank, const moe_ep_bootstrap_t& b) {
          Rank r;
          if (r.create(b, kTimeoutMs) != MOE_EP_SUCCESS) {
            got[rank].status = MOE_EP_ERROR_INTERNAL;
            got[rank].message = "create failed";
            return;
          }
          got[rank] = r.dispatch(3);
          if (got[rank].status == MOE_EP_SUCCESS) got[rank] = r.combine(2);
          moe_ep_destroy(&r.h);
        },
        tamper);
    for (int r = 0; r < 2; ++r) {
      const moe_ep_status_t s = got[r].status;
      if (s == MOE_EP_SUCCESS) {
        ++ok;
      } else if (s == MOE_EP_ERROR_INVALID_INPUT || s == MOE_EP_ERROR_BOOTSTRAP || s == MOE_EP_ERROR_TIMEOUT) {
        ++refused;
      } else {
        unexpected += "seed " + std::to_string(seed) + " rank " + std::to_string(r) + ": status " + std::to_string(s) +
                      " (" + got[r].message + "); ";
      }
    }
  }
  INFO("refused " << refused << ", succeeded " << ok);
  CHECK(unexpected == "");
  CHECK(refused > 0);  // the corruption reached the checks: the test means something
}
