// The NVLINK_TWO_SIDED backend on real GPUs, compared byte for byte with the
// HOST backend on fresh random inputs (gpu_case_runner.cpp), plus the cases
// that only a GPU has: CUDA graphs, timeouts, bad device data, memory reuse
// over many create/destroy cycles.  Runs under mpiexec with any number of
// ranks; every REQUIRE is agreed over all ranks so that they stay in step.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "case_skip.hpp"
#include "dtypes.hpp"
#include "gpu_case_runner.hpp"
#include "gpu_test_env.hpp"
#include "hold_kernel.hpp"
#include "mpi_test_bootstrap.hpp"
#include "scoped_environment.hpp"
#include "tensor_view.hpp"
#include "thread_bootstrap.hpp"

using namespace moe_ep_test;
using namespace moe_ep_verify;

namespace {

const moe_ep_dtype_t kBf16{MOE_EP_DTYPE_BFLOAT, 16, 1};
const moe_ep_dtype_t kFp16{MOE_EP_DTYPE_FLOAT, 16, 1};
const moe_ep_dtype_t kFp32{MOE_EP_DTYPE_FLOAT, 32, 1};
const moe_ep_dtype_t kFp8{MOE_EP_DTYPE_FLOAT8_E4M3FN, 8, 1};
const moe_ep_dtype_t kFp4{MOE_EP_DTYPE_FLOAT4_E2M1FN, 4, 1};

WorkloadSpec spec_for_world(int num_experts, int top_k, int hidden, int max_tokens) {
  WorkloadSpec s;
  s.world = mpi_world_size();
  s.num_experts = num_experts;
  s.top_k = top_k;
  s.hidden_size = hidden;
  s.max_tokens_per_rank = max_tokens;
  return s;
}

// Runs a case on every rank; passes only if it passed on every rank.
void check_case(const WorkloadSpec& spec, const GpuCaseOptions& options = GpuCaseOptions{}) {
  std::string failure;
  try {
    failure = run_gpu_case(spec, world_bootstrap(), options);
  } catch (const std::exception& e) {
    failure = std::string("exception: ") + e.what();
  }
  INFO(spec.describe());
  INFO(failure);
  REQUIRE(mpi_all(failure.empty()));
}

}  // namespace

TEST_CASE("bf16 rows, hidden 7168, top-8 of 64, weights, unequal token counts", "[gpu]") {
  WorkloadSpec s = spec_for_world(64, 8, 7168, 96);
  s.seed = 11;
  check_case(s);
}

TEST_CASE("payload and combine dtypes: fp16 at hidden 2880, fp32 at hidden 100", "[gpu]") {
  WorkloadSpec fp16 = spec_for_world(64, 8, 2880, 64);
  fp16.hidden_dtype = kFp16;
  fp16.combine_dtype = kFp16;
  fp16.weights = false;
  fp16.seed = 12;
  check_case(fp16);

  WorkloadSpec fp32 = spec_for_world(64, 8, 100, 64);  // rows of 400 and combine rows of 400 bytes
  fp32.hidden_dtype = kFp32;
  fp32.combine_dtype = kFp32;
  fp32.seed = 13;
  check_case(fp32);

  WorkloadSpec odd = spec_for_world(64, 4, 100, 33);  // bf16 rows of 200 bytes: not a multiple of 16
  odd.seed = 14;
  check_case(odd);
}

TEST_CASE("quantized payloads travel as bytes with their scales", "[gpu]") {
  WorkloadSpec fp8 = spec_for_world(64, 8, 4096, 80);
  fp8.hidden_dtype = kFp8;
  fp8.scale_row_elems = 4096 / 128;
  fp8.scale_dtype = kFp32;
  fp8.seed = 21;
  check_case(fp8);

  WorkloadSpec fp4 = spec_for_world(64, 8, 7168, 80);  // packed: 3584 bytes per row
  fp4.hidden_dtype = kFp4;
  fp4.scale_row_elems = 7168 / 16;
  fp4.scale_dtype = kFp8;
  fp4.weights = false;
  fp4.seed = 22;
  check_case(fp4);

  WorkloadSpec odd_scales = spec_for_world(64, 8, 2880, 40);
  odd_scales.hidden_dtype = kFp8;
  odd_scales.scale_row_elems = 23;  // 23 fp32 scales: 92-byte rows
  odd_scales.scale_dtype = kFp32;
  odd_scales.seed = 23;
  check_case(odd_scales);
}

TEST_CASE("token counts: zero on one rank, runtime_max below the maximum, masked picks", "[gpu]") {
  WorkloadSpec zero = spec_for_world(64, 8, 4096, 64);
  zero.runtime_max_tokens_per_rank = 40;
  for (int r = 0; r < zero.world; ++r) zero.tokens.push_back(r == 0 ? 0 : 40 - 3 * r);
  zero.seed = 31;
  check_case(zero);

  WorkloadSpec all_zero = spec_for_world(64, 8, 256, 16);
  all_zero.tokens.assign(all_zero.world, 0);
  check_case(all_zero);

  WorkloadSpec masked = spec_for_world(64, 8, 2880, 64);
  masked.routing.mask_fraction = 0.35;
  masked.seed = 32;
  check_case(masked);

  WorkloadSpec other_invalid = spec_for_world(64, 6, 512, 48);
  other_invalid.invalid_expert_id = 1000;
  other_invalid.routing.mask_fraction = 0.5;
  other_invalid.seed = 33;
  check_case(other_invalid);
}

// The small-batch kernels at their bound (dispatch: one routing round of 512
// tokens per rank), whatever MOE_EP_SMALL_DISPATCH_TOKENS and
// MOE_EP_SMALL_COMBINE_TOKENS default to; with MOE_EP_SMALL_BATCH=0 (the
// general-kernels suite) the general kernels run.
TEST_CASE("small-batch kernels up to 512 tokens per rank: unequal counts, masked picks, top-12", "[gpu][small_batch]") {
  const ScopedEnvironment dispatch_bound("MOE_EP_SMALL_DISPATCH_TOKENS", "512");
  const ScopedEnvironment combine_bound("MOE_EP_SMALL_COMBINE_TOKENS", "512");
  WorkloadSpec full = spec_for_world(256, 8, 7168, 512);
  for (int r = 0; r < full.world; ++r) full.tokens.push_back(512 - 37 * (r % 3));
  full.routing.mask_fraction = 0.2;
  full.eplb_stats = true;
  full.seed = 51;
  check_case(full);
  GpuCaseOptions graph;
  graph.graph = true;
  full.seed = 53;
  check_case(full, graph);
  WorkloadSpec wide = spec_for_world(64, 12, 1000, 300);  // more picks than the kernel holds in registers
  wide.runtime_max_tokens_per_rank = 257;
  for (int r = 0; r < wide.world; ++r) wide.tokens.push_back(257 - 5 * r);
  wide.seed = 52;
  check_case(wide);
}

TEST_CASE("top_k 1, 8 and 32 of 64 experts; 6 experts on 2 ranks", "[gpu]") {
  for (int k : {1, 8, 32}) {
    WorkloadSpec s = spec_for_world(64, k, 1024, 48);
    s.seed = 40 + k;
    check_case(s);
  }
  const int world = mpi_world_size();
  WorkloadSpec six = spec_for_world(6 % world == 0 ? 6 : 3 * world, 2, 768, 40);
  six.seed = 45;
  check_case(six);
  WorkloadSpec all = spec_for_world(16, 16, 64, 24);  // top_k == num_experts
  all.seed = 46;
  check_case(all);
}

TEST_CASE("EPLB statistics: counted on the device, or passed by the caller", "[gpu]") {
  WorkloadSpec counted = spec_for_world(64, 8, 512, 48);
  counted.eplb_stats = true;
  counted.routing.mask_fraction = 0.1;
  counted.seed = 51;
  check_case(counted);
  WorkloadSpec passed = counted;
  passed.eplb_given = true;
  passed.seed = 52;
  check_case(passed);
}

// The routing scan takes 2048 or 4096 tokens per pass (docs/nvlink_backend.md,
// Dispatch): 5000 tokens take several passes, with a block's own tokens across a
// pass boundary.  Each block counts the picks of its slice of the experts:
// 8192 experts on one SM put the slice's counts in global memory (more than
// 4096), on 3 SMs and by default in shared memory; the small-batch kernel
// (100 tokens) counts all 8192 in global memory.  EPLB rows and masked picks
// check that every expert's count arrives exactly once.
TEST_CASE("routing over several passes; expert counts from every block's slice, in shared or global memory",
          "[gpu][routing]") {
  WorkloadSpec many = spec_for_world(8192, 4, 64, 5000);
  for (int r = 0; r < many.world; ++r) many.tokens.push_back(5000 - 7 * r);
  many.eplb_stats = true;
  many.routing.mask_fraction = 0.1;
  many.seed = 81;
  check_case(many);
  GpuCaseOptions one;
  one.num_sms = 1;
  many.seed = 82;
  check_case(many, one);
  GpuCaseOptions three;
  three.num_sms = 3;
  many.seed = 83;
  check_case(many, three);
  WorkloadSpec small = spec_for_world(8192, 8, 64, 100);
  small.eplb_stats = true;
  small.seed = 84;
  check_case(small);
  WorkloadSpec wide = spec_for_world(64, 8, 512, 4500);  // 3 passes of 2048 tokens, 2 of 4096
  wide.tokens.assign(wide.world, 4500);
  wide.seed = 85;
  check_case(wide);
}

TEST_CASE("combine into the caller's buffer, and with few SMs", "[gpu]") {
  WorkloadSpec s = spec_for_world(64, 8, 2048, 128);
  s.seed = 61;
  GpuCaseOptions caller;
  caller.caller_output = true;
  check_case(s, caller);
  GpuCaseOptions few;
  few.num_sms = 3;
  few.caller_output = true;
  check_case(s, few);
}

// Many segments per warp on one or two blocks, so that a warp's bulk-copy ring
// (MOE_EP_DISPATCH_BULK=1; CTest nvlink_gpu_dispatch_bulk*) wraps many times:
// 128 tokens of 14,336 bytes on one block are 640 items, 40 per warp.  Rows
// of 4,112 bytes end in a 16-byte segment; rows of 14,328 bytes are not a
// multiple of 16 and must take the register path whatever the switch says.
TEST_CASE("dispatch rows on 1 and 2 SMs: many segments per warp, rows aligned or not", "[gpu][dispatch_rows]") {
  GpuCaseOptions one;
  one.num_sms = 1;
  GpuCaseOptions two;
  two.num_sms = 2;
  WorkloadSpec aligned = spec_for_world(64, 8, 7168, 128);
  aligned.seed = 71;
  check_case(aligned, one);
  check_case(aligned, two);
  WorkloadSpec short_tail = spec_for_world(64, 8, 2056, 96);
  short_tail.seed = 72;
  check_case(short_tail, one);
  WorkloadSpec unaligned = spec_for_world(64, 8, 7164, 128);
  unaligned.seed = 73;
  check_case(unaligned, one);
  check_case(unaligned, two);
  GpuCaseOptions graph = two;
  graph.graph = true;
  aligned.seed = 74;
  check_case(aligned, graph);
}

TEST_CASE("zero-copy combine input: combine from the combine_input view equals the HOST oracle", "[gpu][zero_copy]") {
  WorkloadSpec s = spec_for_world(64, 8, 256, 512);
  s.seed = 67;
  GpuCaseOptions zero_copy;
  zero_copy.zero_copy_combine = true;
  check_case(s, zero_copy);
  s.runtime_max_tokens_per_rank = 100;  // a view of fewer rows than the region holds
  zero_copy.caller_output = true;
  check_case(s, zero_copy);
}

TEST_CASE("zero-copy combine input: ranks that pass their own buffer instead of the view", "[gpu][zero_copy]") {
  WorkloadSpec s = spec_for_world(64, 8, 7168, 96);
  s.seed = 68;
  GpuCaseOptions mixed;
  mixed.zero_copy_combine = true;
  mixed.rounds = 4;
  // Odd ranks pass their own buffer in even rounds, even ranks in odd rounds:
  // every rank takes both ways, next to peers that take either.
  mixed.zero_copy_passes_view = [](int rank, int round) { return (rank + round) % 2 == 0; };
  check_case(s, mixed);
  GpuCaseOptions none = mixed;
  none.zero_copy_passes_view = [](int, int) { return false; };
  none.num_sms = 4;
  s.seed = 69;
  check_case(s, none);
}

namespace {

// Every 8th element of a rank's expert output (chosen by a hash of rank,
// round and position) becomes one of `specials`: so partials meet as -0 and
// -0, inf and -inf, the largest finite and itself (overflow), subnormals,
// NaNs with payloads, and ordinary values.
template <typename Bits>
void plant_specials(int rank, int round, std::vector<uint8_t>& eo, const std::vector<Bits>& specials) {
  const size_t n = eo.size() / sizeof(Bits);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h = (static_cast<uint64_t>(rank) << 40) ^ (static_cast<uint64_t>(round) << 32) ^ i;
    h *= 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    if (h % 8 != 0) continue;
    const Bits v = specials[(h >> 3) % specials.size()];
    std::memcpy(eo.data() + i * sizeof(Bits), &v, sizeof(Bits));
  }
}

}  // namespace

TEST_CASE("combine sums special values (-0, inf, overflow, subnormals, NaNs) as the HOST backend does",
          "[gpu][zero_copy][special_values]") {
  // The zero-copy pull sums two 16-bit partials with packed adds and takes
  // fp32 for NaN results; the push path always takes fp32.  Both must
  // give the HOST backend's bits, NaNs aside (any NaN equals any NaN: a sum
  // with a NaN is the hardware's NaN).
  const std::vector<uint16_t> bf16 = {0x8000, 0x0000, 0x7F80, 0xFF80, 0x7F7F, 0xFF7F, 0x0001,
                                      0x8001, 0x807F, 0x7FA5, 0xFFC1, 0x3F80, 0xBF80};
  const std::vector<uint16_t> fp16 = {0x8000, 0x0000, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0001,
                                      0x8001, 0x83FF, 0x7E55, 0xFD01, 0x3C00, 0xBC00};
  const std::vector<uint32_t> fp32 = {0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F7FFFFFu, 0x00000001u,
                                      0x80000001u, 0x7FC12345u, 0xFF812345u, 0x3F800000u};
  for (const bool zero_copy : {true, false}) {
    INFO("zero_copy_combine " << zero_copy);
    // One case per combine dtype, its specials planted in every rank's expert output.
    auto check_with = [&](moe_ep_dtype_t dtype, int hidden, uint64_t seed, const auto& specials) {
      WorkloadSpec s = spec_for_world(64, 8, hidden, 64);
      s.hidden_dtype = dtype;
      s.combine_dtype = dtype;
      s.seed = seed;
      GpuCaseOptions o;
      o.zero_copy_combine = zero_copy;
      o.nans_compare_equal = true;
      o.edit_expert_output = [&](int rank, int round, std::vector<uint8_t>& eo) {
        plant_specials(rank, round, eo, specials);
      };
      check_case(s, o);
    };
    check_with(kBf16, 7168, 131, bf16);
    check_with(kFp16, 2880, 132, fp16);
    check_with(kFp32, 1000, 133, fp32);
  }
}

TEST_CASE("a CUDA graph of dispatch + combine replays with results identical to eager calls", "[gpu][graph]") {
  WorkloadSpec s = spec_for_world(64, 8, 7168, 64);
  s.seed = 71;
  GpuCaseOptions graph;
  graph.graph = true;
  graph.rounds = 4;
  check_case(s, graph);
  graph.caller_output = true;
  s.seed = 72;
  s.runtime_max_tokens_per_rank = 50;
  check_case(s, graph);
}

TEST_CASE(
    "active-rank mask: ranks made inactive and active again, eager, split and in a replayed graph, "
    "equal the HOST backend",
    "[gpu][mask]") {
  const int world = mpi_world_size();
  if (world < 2) {
    WARN("skipped: a mask needs two ranks or more (one must stay active)");
    return;
  }
  // Round 0 all active, then the last rank out, then rank 0 out (the last
  // back), then every rank active again.
  GpuCaseOptions o;
  o.rounds = 4;
  o.active_ranks = [world](int round) {
    std::vector<uint8_t> a(static_cast<size_t>(world), 1);
    if (round == 1) a[static_cast<size_t>(world - 1)] = 0;
    if (round == 2) a[0] = 0;
    return a;
  };
  WorkloadSpec s = spec_for_world(64, 8, 1024, 64);
  s.seed = 81;
  check_case(s, o);
  o.graph = true;
  s.seed = 82;
  check_case(s, o);
  o.graph = false;
  o.phases = GpuPhases::micro_batches2;
  s.seed = 83;
  check_case(s, o);
}

TEST_CASE("bad expert ids are dropped and reported as INVALID_INPUT, like the HOST backend", "[gpu][bad_ids]") {
  WorkloadSpec s = spec_for_world(64, 8, 512, 48);
  s.seed = 81;
  for (int r = 0; r < s.world; ++r) s.tokens.push_back(40);
  GpuCaseOptions bad;
  bad.edit_inputs = [&](int rank, RankInputs& d) {
    if (rank % 2 != 0) return;  // odd ranks stay clean: SUCCESS there
    std::vector<int32_t>& ids = d.routing.topk_ids;
    ids[5 * 8 + 3] = 64;  // one past the last expert
    ids[7 * 8 + 0] = -5;  // negative, not the invalid id
    ids[30 * 8 + 7] = INT_MAX;
    ids[31 * 8 + 1] = INT_MIN;
  };
  check_case(s, bad);  // compares the async status and message with HOST's, and that it is cleared once read
}

TEST_CASE("two handles in one process: a second group runs while the first has a dispatch in flight", "[gpu][handles]") {
  WorkloadSpec outer = spec_for_world(64, 8, 1024, 48);
  outer.seed = 91;
  WorkloadSpec inner = spec_for_world(32, 4, 4096, 32);
  inner.hidden_dtype = kFp16;
  inner.combine_dtype = kFp16;
  inner.seed = 92;
  GpuCaseOptions o;
  o.rounds = 2;
  o.between_dispatch_and_combine = [&] {
    const std::string f = run_gpu_case(inner, world_bootstrap(), GpuCaseOptions{});
    if (!f.empty()) throw std::runtime_error("inner handle: " + f);
  };
  check_case(outer, o);
}

TEST_CASE("two ranks as two threads of one process, one GPU each", "[gpu][handles][one_process]") {
  if (mpi_world_size() != 1 || gpu_device_count() < 2) {
    skip_case("needs one process and two GPUs");
    return;
  }
  WorkloadSpec s;
  s.world = 2;
  s.num_experts = 64;
  s.top_k = 8;
  s.hidden_size = 7168;
  s.max_tokens_per_rank = 64;
  s.seed = 95;
  std::vector<std::string> failures(2);
  run_ranks(2, [&](int rank, const moe_ep_bootstrap_t& b) {
    GpuCaseOptions o;
    o.device = rank;
    try {
      failures[rank] = run_gpu_case(s, b, o);
    } catch (const std::exception& e) {
      failures[rank] = e.what();
    }
  });
  INFO(failures[0] << failures[1]);
  REQUIRE((failures[0].empty() && failures[1].empty()));
}

namespace {

// A minimal NVLink handle driven through the C API, for lifecycle tests.
struct SmallHandle {
  moe_ep_handle_t h = nullptr;
  WorkloadSpec spec;
  void* hidden = nullptr;
  void* ids = nullptr;
  void* expert_output = nullptr;
  int64_t T = 0;

  SmallHandle(const WorkloadSpec& s, int timeout_ms) : spec(s) {
    spec.weights = false;  // dispatch() passes hidden states and ids only
    moe_ep_params_t p = spec.params();
    moe_ep_config_t c;
    moe_ep_config_init(&c, sizeof c);
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.timeout_ms = timeout_ms;
    c.device = gpu_device();
    const moe_ep_bootstrap_t& b = world_bootstrap();
    if (moe_ep_create(&b, &p, &c, &h) != MOE_EP_SUCCESS) throw std::runtime_error(moe_ep_last_error());
    const RankInputs d = make_rank_inputs(spec, b.rank);
    T = d.routing.num_tokens;
    cuda_ok(cudaMalloc(&hidden, d.hidden.size() + 1), "cudaMalloc");
    cuda_ok(cudaMalloc(&ids, d.routing.topk_ids.size() * 4 + 4), "cudaMalloc");
    const size_t eo = size_t(spec.receive_rows()) * spec.combine_row_bytes();
    cuda_ok(cudaMalloc(&expert_output, eo), "cudaMalloc");
    cuda_ok(cudaMemcpy(hidden, d.hidden.data(), d.hidden.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_ok(cudaMemcpy(ids, d.routing.topk_ids.data(), d.routing.topk_ids.size() * 4, cudaMemcpyHostToDevice),
            "cudaMemcpy");
    cuda_ok(cudaMemset(expert_output, 0, eo), "cudaMemset");
  }
  ~SmallHandle() {
    moe_ep_destroy(&h);
    cudaFree(hidden);
    cudaFree(ids);
    cudaFree(expert_output);
  }
  moe_ep_status_t dispatch(cudaStream_t stream = nullptr) {
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, gpu_device()};
    DispatchMemory memory;
    memory.hidden = hidden;
    memory.topk_ids = ids;
    DispatchArgs args(spec, static_cast<int>(T), memory, dev);  // spec: no weights, scales or eplb
    moe_ep_dispatch_result_t r;
    moe_ep_dispatch_result_init(&r, sizeof r);
    return moe_ep_dispatch(h, args.get(), &r, stream);
  }
  // expert_output is exactly [world * tokens_per_rank, hidden]: a read past
  // it is an out-of-bounds access that compute-sanitizer reports.
  moe_ep_status_t combine(cudaStream_t stream = nullptr) {
    const moe_ep_device_t dev{MOE_EP_DEVICE_CUDA, gpu_device()};
    const TensorView te = expert_output_view(spec, expert_output, dev);
    moe_ep_combine_result_t r;
    moe_ep_combine_result_init(&r, sizeof r);
    return moe_ep_combine(h, te.get(), nullptr, &r, stream);
  }
  moe_ep_status_t poll(std::string* message) {
    moe_ep_status_t s = MOE_EP_SUCCESS;
    if (moe_ep_get_async_error(h, &s) != MOE_EP_SUCCESS) return MOE_EP_ERROR_INTERNAL;
    *message = s ? moe_ep_last_error() : "";
    return s;
  }
};

// One rank leaves the group mid-sequence; the others must time out, say
// which phase and which rank, refuse further calls, and destroy promptly.
void check_timeout(bool skip_dispatch) {
  const int world = mpi_world_size();
  const int missing = world - 1;
  WorkloadSpec s = spec_for_world(64, 8, 1024, 32);
  s.seed = 101;
  bool ok = true;
  std::string why;
  {
    SmallHandle h(s, 400);
    ok = h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS;  // one good round
    std::string m;
    ok = ok && h.poll(&m) == MOE_EP_SUCCESS;
    const bool i_skip = mpi_rank() == missing;
    if (!i_skip) {
      ok = ok && h.dispatch() == MOE_EP_SUCCESS;
      if (!skip_dispatch) ok = ok && h.combine() == MOE_EP_SUCCESS;
      const moe_ep_status_t st = h.poll(&m);
      const std::string expected = std::string(skip_dispatch ? "dispatch" : "combine") + " waiting for rank " +
                                   std::to_string(missing);
      why = "poll: " + std::string(moe_ep_status_string(st)) + " '" + m + "'";
      ok = ok && st == MOE_EP_ERROR_TIMEOUT && m.find(expected) != std::string::npos;
      // Sticky: later calls fail at once with the same status.
      const moe_ep_status_t again = skip_dispatch ? h.dispatch() : h.dispatch();
      ok = ok && again == MOE_EP_ERROR_TIMEOUT;
    } else if (!skip_dispatch) {
      ok = ok && h.dispatch() == MOE_EP_SUCCESS;  // dispatches, then never combines
      cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
    const auto start = std::chrono::steady_clock::now();
    moe_ep_destroy(&h.h);  // never waits for a peer
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ok = ok && seconds < 5.0;
    if (seconds >= 5.0) why += " destroy took " + std::to_string(seconds) + " s";
  }
  INFO(why);
  REQUIRE(mpi_all(ok));
}

// After a barrier: a peer's mapping of this rank's memory keeps it allocated
// until the peer has destroyed its handle too.
size_t free_device_memory() {
  mpi_all(true);
  size_t free_bytes = 0, total = 0;
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return free_bytes;
}

}  // namespace

TEST_CASE("a rank that skips a dispatch makes the others time out; destroy completes", "[gpu][timeout][multi_rank]") {
  if (mpi_world_size() < 2) {
    skip_case("needs at least two ranks");
    return;
  }
  check_timeout(true);
  check_timeout(false);
  // The group is usable again with fresh handles.
  WorkloadSpec s = spec_for_world(64, 8, 1024, 32);
  s.seed = 102;
  check_case(s);
}

TEST_CASE("100 create/destroy cycles leave device memory where it was", "[gpu][lifecycle]") {
  WorkloadSpec s = spec_for_world(64, 8, 2048, 64);
  s.seed = 111;
  bool ok = true;
  {
    SmallHandle warm(s, 20000);
    ok = warm.dispatch() == MOE_EP_SUCCESS && warm.combine() == MOE_EP_SUCCESS;
  }
  const size_t before = free_device_memory();
  for (int i = 0; i < 100 && ok; ++i) {
    SmallHandle h(s, 20000);
    ok = h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS;
  }
  const size_t after = free_device_memory();
  INFO("free before " << before << ", after " << after);
  REQUIRE(mpi_all(ok));
  REQUIRE(mpi_all(after + (2u << 20) >= before));  // within one allocation granule
}

// The path each call reports (moe_ep_get_last_path) with the path knobs at
// their defaults: a small call takes the small-batch kernels, a large one the
// general dispatch (by scan up to 2048 tokens) and the serial push combine, or
// the overlapped one on 2 or more ranks of at least 64 SMs.
TEST_CASE("paths: a small call takes the small-batch kernels, a large one the general kernels", "[gpu][path]") {
  std::vector<std::unique_ptr<ScopedEnvironment>> defaults;
  for (const char* knob : {"MOE_EP_SMALL_BATCH", "MOE_EP_SMALL_DISPATCH_TOKENS", "MOE_EP_SMALL_COMBINE_TOKENS",
                           "MOE_EP_DISPATCH_BULK", "MOE_EP_DISPATCH_LOOKBACK", "MOE_EP_COMBINE_SCHEDULE"}) {
    defaults.push_back(std::make_unique<ScopedEnvironment>(knob, nullptr));
  }
  int sms = 0, major = 0;
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, gpu_device()), "cudaDeviceGetAttribute");
  cuda_ok(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, gpu_device()), "cudaDeviceGetAttribute");
  const bool bulk = major >= 9 && sms <= 8;  // dispatch's bulk-copy rows by default
  const bool overlapped = mpi_world_size() > 1 && sms >= 64;
  const struct {
    int tokens;
    int32_t dispatch;
    int32_t combine;
  } cases[] = {
      {8, bulk ? MOE_EP_PATH_DISPATCH_SMALL_BULK : MOE_EP_PATH_DISPATCH_SMALL, MOE_EP_PATH_COMBINE_SMALL_PUSH},
      {1024, bulk ? MOE_EP_PATH_DISPATCH_SCAN_BULK : MOE_EP_PATH_DISPATCH_SCAN,
       overlapped ? MOE_EP_PATH_COMBINE_OVERLAPPED_PUSH : MOE_EP_PATH_COMBINE_SERIAL_PUSH},
  };
  for (const auto& c : cases) {
    INFO("tokens per rank " << c.tokens);
    WorkloadSpec s = spec_for_world(64, 8, 2048, c.tokens);
    s.seed = 113;
    SmallHandle h(s, 20000);
    int32_t dispatch_path = -1, combine_path = -1;
    bool ok = moe_ep_get_last_path(h.h, MOE_EP_PHASE_DISPATCH, &dispatch_path) == MOE_EP_SUCCESS &&
              dispatch_path == MOE_EP_PATH_NONE;
    ok = ok && h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS;
    ok = ok && moe_ep_get_last_path(h.h, MOE_EP_PHASE_DISPATCH, &dispatch_path) == MOE_EP_SUCCESS;
    ok = ok && moe_ep_get_last_path(h.h, MOE_EP_PHASE_COMBINE, &combine_path) == MOE_EP_SUCCESS;
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    INFO("dispatch " << moe_ep_path_name(dispatch_path) << ", combine " << moe_ep_path_name(combine_path));
    REQUIRE(mpi_all(ok && dispatch_path == c.dispatch && combine_path == c.combine));
  }
}

TEST_CASE("workspace: moe_ep_workspace_size is what create allocates, within docs/semantics.md §6",
          "[gpu][lifecycle]") {
  // With and without the zero-copy view: the view replaces the push combine's
  // landing rows, so both stay within the bound.
  for (const int32_t zero_copy : {0, 1}) {
    INFO("zero_copy_combine " << zero_copy);
    WorkloadSpec s = spec_for_world(256, 8, 7168, 512);
    moe_ep_params_t p = s.params();
    moe_ep_config_t c;
    moe_ep_config_init(&c, sizeof c);
    c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    c.device = gpu_device();
    c.zero_copy_combine = zero_copy;
    uint64_t bytes = 0;
    REQUIRE(moe_ep_workspace_size(&p, &c, s.world, &bytes) == MOE_EP_SUCCESS);
    const uint64_t row = 7168 * 2;
    const uint64_t bound = 2ull * s.world * s.max_tokens_per_rank * row + (64ull << 20);
    const size_t before = free_device_memory();
    moe_ep_handle_t h = nullptr;
    const moe_ep_bootstrap_t& b = world_bootstrap();
    REQUIRE(mpi_all(moe_ep_create(&b, &p, &c, &h) == MOE_EP_SUCCESS));
    const size_t during = free_device_memory();
    moe_ep_destroy(&h);
    const uint64_t used = before - during;
    INFO("workspace_size " << bytes << ", device memory taken " << used << ", bound (docs/semantics.md §6) " << bound);
    REQUIRE(mpi_all(bytes <= bound));
    // Ranks that share this GPU (more ranks than GPUs) allocate theirs from the
    // same free memory during the same collective create.
    const uint64_t sharing = static_cast<uint64_t>((s.world + gpu_device_count() - 1) / gpu_device_count());
    INFO("ranks per GPU at most " << sharing);
    REQUIRE(mpi_all(used >= bytes && used <= sharing * (bytes + (4u << 20))));
  }
}

TEST_CASE(
    "runtime_max_tokens_per_rank that differs between ranks is INVALID_INPUT on every rank, nothing read "
    "out of bounds",
    "[gpu][peer_counts][multi_rank]") {
  const int world = mpi_world_size();
  if (world < 2) {
    skip_case("needs at least two ranks");
    return;
  }
  // Rank 0 passes 16, the others 48 (max 48), each with a full batch: a
  // rank-48 peer sends rank 0 more rows than rank 0's expert_output holds
  // per peer, which combine would read past the end of without the check.
  WorkloadSpec s = spec_for_world(64, 8, 1024, 48);
  s.seed = 121;
  s.runtime_max_tokens_per_rank = mpi_rank() == 0 ? 16 : 48;
  s.tokens.assign(world, 0);
  s.tokens[mpi_rank()] = s.runtime_max_tokens_per_rank;
  bool ok = true;
  std::string why;
  {
    SmallHandle h(s, 20000);
    for (int round = 0; round < 2 && ok; ++round) {
      ok = h.dispatch() == MOE_EP_SUCCESS && h.combine() == MOE_EP_SUCCESS;
      std::string m;
      const moe_ep_status_t st = h.poll(&m);
      why = "round " + std::to_string(round) + ": " + moe_ep_status_string(st) + " '" + m + "'";
      ok = ok && st == MOE_EP_ERROR_INVALID_INPUT && m.find("tokens_per_rank") != std::string::npos &&
           m.find("must be the same on every rank") != std::string::npos;
      ok = ok && h.poll(&m) == MOE_EP_SUCCESS;  // read once, then cleared; the handle stays usable
    }
    ok = ok && cudaDeviceSynchronize() == cudaSuccess;
  }
  INFO(why);
  REQUIRE(mpi_all(ok));
  // The same group, equal values again: correct results.
  WorkloadSpec same = spec_for_world(64, 8, 1024, 48);
  same.seed = 122;
  same.runtime_max_tokens_per_rank = 16;
  check_case(same);
}

// Hidden by default (run it by its tag, [destroy_scope]): it measures
// whether destroy's teardown waits for unrelated device work, which depends on
// the driver as well as on the library: the handle's own wait is scoped to its
// events, and the host mirror goes back to a pool instead of cudaFreeHost, so
// that a teardown call does not wait for the whole device.
TEST_CASE("destroy after graph replays waits for the handle's work, not for other work on the device",
          "[.destroy_scope]") {
  WorkloadSpec s = spec_for_world(64, 8, 1024, 32);
  s.seed = 131;
  s.tokens.assign(s.world, 32);  // a graph has fixed shapes
  bool ok = true;
  std::string why;
  cudaStream_t stream = nullptr, other = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cuda_ok(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  int* release = nullptr;
  int* release_device = nullptr;
  cuda_ok(cudaHostAlloc(reinterpret_cast<void**>(&release), sizeof(int), cudaHostAllocMapped), "cudaHostAlloc");
  *release = 0;
  cuda_ok(cudaHostGetDevicePointer(reinterpret_cast<void**>(&release_device), release, 0), "cudaHostGetDevicePointer");
  {
    SmallHandle h(s, 20000);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    cuda_ok(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    ok = h.dispatch(stream) == MOE_EP_SUCCESS && h.combine(stream) == MOE_EP_SUCCESS;
    cuda_ok(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int i = 0; i < 3; ++i) cuda_ok(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
    std::string m;
    const moe_ep_status_t polled = h.poll(&m);  // waits for the replays (their event), not the device
    const cudaError_t replays = cudaStreamQuery(stream);
    ok = ok && polled == MOE_EP_SUCCESS && replays == cudaSuccess;
    why = std::string("poll ") + moe_ep_status_string(polled) + ", replays after poll " + cudaGetErrorName(replays) + "; ";
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    mpi_all(true);
    // Unrelated work that runs for 3 s on another stream.
    cuda_ok(moe_ep_test::launch_hold(other, release_device, 3000000000LL), "launch_hold");
    const auto start = std::chrono::steady_clock::now();
    moe_ep_destroy(&h.h);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    why += "destroy took " + std::to_string(seconds) + " s with 3 s of unrelated work in flight";
    ok = ok && seconds < 1.0;
    *release = 1;
    cuda_ok(cudaStreamSynchronize(other), "cudaStreamSynchronize");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaFreeHost(release);
  cudaStreamDestroy(stream);
  cudaStreamDestroy(other);
  INFO(why);
  WARN(why);
  REQUIRE(mpi_all(ok));
}
