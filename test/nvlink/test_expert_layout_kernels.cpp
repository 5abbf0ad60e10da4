// The expert layouts' GPU kernels (cuda/expert_layout_kernels.h) against the
// HOST backend's expansion and reduction (src/expert_layout.hpp), bitwise, on
// fresh random rank-major receives: both layouts, alignments, capacities and
// row bounds that drop pairs, every combine dtype, scales in both layouts,
// with and without weights, pre-weighted expert output, top_k above a warp,
// local experts beyond the shared-memory counters, and a shorter
// tokens_per_rank than the maximum.  Every output is poisoned first; each
// buffer set is used for several calls (the ranking's ticket must come back
// to zero).  One GPU, no MPI; exits 77 (skipped) without a GPU.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/region_planner.hpp"
#include "dtype.hpp"
#include "expert_layout.hpp"
#include "expert_layout_kernels.h"
#include "gpu/expert_rows_plan.hpp"
#include "moe_ep_c.h"
#include "params.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  if (++failures <= 30) std::printf("FAILED: %s\n", what.c_str());
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::printf("FATAL: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

struct Case {
  const char* name;
  int32_t world, rank, experts, top_k, max_tpr, tpr, hidden;
  int32_t layout;     // MOE_EP_LAYOUT_*
  int32_t capacity;   // EXPERT_MAJOR, 0 = default
  int32_t alignment;  // EXPERT_PACKED, 0 = default
  int32_t rows;       // EXPERT_PACKED bound, 0 = default
  moe_ep_dtype_t combine;
  int32_t scales;   // scale elements per row
  int32_t columns;  // COLUMN_MAJOR scales
  bool weights;     // dispatch had topk_weights
  bool weighted;    // expert_output_weighted
};

template <typename T>
T* device_copy(const std::vector<T>& v) {
  T* d = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&d), v.size() * sizeof(T) + 16), "cudaMalloc input");
  if (!v.empty()) check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "copy input");
  return d;
}

template <typename T>
std::vector<T> host_copy(const void* d, size_t n) {
  std::vector<T> v(n);
  if (n) check(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "copy result");
  return v;
}

// A combine-dtype value's bits from a float.
void store_value(const moe_ep_dtype_t& dt, uint8_t* row, int32_t h, float f) {
  moe_ep::store_from_float(dt, row, h, f);
}

void run_call(const Case& c, const moe_ep::Layout& l, const moe_ep::ExpertRowsOffsets& o, char* base,
              std::mt19937_64& rng, int call) {
  const std::string tag = std::string(c.name) + " call " + std::to_string(call) + ": ";
  const int32_t W = l.world_size, K = l.top_k, tpr = c.tpr, E = l.experts_per_rank(), first = l.rank * E;
  const int64_t receive = int64_t{W} * tpr;
  const uint64_t hb = l.hidden_row_bytes, sb = l.scale_row_bytes, cb = l.combine_row_bytes;
  std::uniform_int_distribution<int32_t> byte(0, 255);

  // A random rank-major receive: counts, rewritten ids (local picks keep
  // their global id, the others are invalid), rows, scales, weights, tokens.
  std::vector<int32_t> counts(W);
  for (auto& n : counts) n = std::uniform_int_distribution<int32_t>(0, tpr)(rng);
  if (call == 0) counts[0] = tpr;  // a full source
  std::vector<int32_t> ids(size_t(receive * K), l.invalid_expert_id), tokens(size_t(receive), -7);
  std::vector<float> weights(size_t(receive * K), 0.0f);
  std::vector<uint8_t> hidden(size_t(receive * hb)), scales(size_t(receive * sb));
  for (auto& b : hidden) b = uint8_t(byte(rng));
  for (size_t i = 0; i < scales.size() / 4; ++i) {
    const float f = std::uniform_real_distribution<float>(-4, 4)(rng);
    std::memcpy(&scales[i * 4], &f, 4);
  }
  std::uniform_int_distribution<int32_t> any_expert(0, l.num_experts - 1), local(first, first + E - 1);
  for (int32_t s = 0; s < W; ++s) {
    for (int32_t j = 0; j < counts[s]; ++j) {
      const int64_t i = int64_t{s} * tpr + j;
      tokens[size_t(i)] = std::uniform_int_distribution<int32_t>(0, 1 << 20)(rng);
      for (int32_t k = 0; k < K; ++k) {
        // Mostly local picks, so that experts fill and some overflow.
        const int32_t id = byte(rng) < 160 ? local(rng) : any_expert(rng);
        ids[size_t(i * K + k)] = id >= first && id < first + E ? id : l.invalid_expert_id;
        weights[size_t(i * K + k)] = std::uniform_real_distribution<float>(-1, 1)(rng);
      }
    }
  }
  moe_ep::RankMajorReceive hin;
  hin.tokens_per_rank = tpr;
  hin.hidden = hidden.data();
  hin.scales = sb ? scales.data() : nullptr;
  hin.topk_ids = ids.data();
  hin.topk_weights = c.weights ? weights.data() : nullptr;
  hin.recv_counts = counts.data();
  hin.source_tokens = tokens.data();
  moe_ep::ExpertRows want;
  moe_ep::allocate_expert_rows(l, want);
  moe_ep::expand_to_expert_rows(l, hin, want);

  // The same on the GPU, outputs poisoned.
  moe_ep::kernels::RankMajorReceive din{};
  din.tokens_per_rank = tpr;
  din.hidden = device_copy(hidden);
  din.scales = sb ? device_copy(scales) : nullptr;
  din.ids = device_copy(ids);
  din.weights = c.weights ? device_copy(weights) : nullptr;
  din.recv_counts = device_copy(counts);
  din.source_tokens = device_copy(tokens);
  const moe_ep::kernels::ExpertRowsBuffers b = moe_ep::expert_rows_buffers(l, base, o);
  const int64_t rows = l.expert_layout_rows();
  check(cudaMemset(b.hidden, 0xFF, size_t(rows) * hb), "poison");
  if (b.scales) check(cudaMemset(b.scales, 0xFF, want.scales.size()), "poison");
  check(cudaMemset(b.counts, 0xFF, size_t(E) * 4), "poison");
  check(cudaMemset(b.offsets, 0xFF, size_t(E + 1) * 4), "poison");
  check(cudaMemset(b.sources, 0xFF, size_t(rows) * 12), "poison");
  check(cudaMemset(b.weights, 0xFF, size_t(rows) * 4), "poison");
  check(cudaMemset(b.dropped, 0xFF, 4), "poison");
  check(cudaMemset(b.token_rows, 0xFF, size_t(receive) * K * 4), "poison");
  const moe_ep::kernels::ExpertLayoutShape shape = moe_ep::expert_layout_shape(l);
  const int32_t blocks = int32_t(1 + rng() % 132);
  check(moe_ep::kernels::launch_expand_to_expert_rows(shape, din, b, blocks, int(call % 2), nullptr), "expand");
  check(cudaDeviceSynchronize(), "expand");

  expect(host_copy<int32_t>(b.counts, size_t(E)) == want.counts, tag + "expert_counts");
  expect(host_copy<int32_t>(b.offsets, size_t(E + 1)) == want.offsets, tag + "expert_offsets");
  expect(host_copy<int32_t>(b.dropped, 1) == want.dropped, tag + "dropped_pairs");
  expect(host_copy<int32_t>(b.sources, size_t(rows) * 3) == want.sources, tag + "row_sources");
  const auto got_weights = host_copy<uint32_t>(b.weights, size_t(rows));
  expect(std::memcmp(got_weights.data(), want.weights.data(), size_t(rows) * 4) == 0, tag + "row_weights");
  expect(host_copy<uint32_t>(b.ticket, 1)[0] == 0, tag + "ticket back at zero");
  // Payload and scales of the rows that hold a pair (padding is unspecified).
  const auto got_hidden = host_copy<uint8_t>(b.hidden, size_t(rows) * hb);
  const auto got_scales = b.scales ? host_copy<uint8_t>(b.scales, want.scales.size()) : std::vector<uint8_t>();
  int64_t data_rows = 0, bad_rows = 0, bad_scales = 0;
  const int64_t column = l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR ? moe_ep::scale_column_rows(l.expert_capacity)
                                                                        : moe_ep::scale_column_rows(rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (want.sources[size_t(r * 3)] < 0) continue;
    ++data_rows;
    if (std::memcmp(&got_hidden[size_t(r * hb)], &want.hidden[size_t(r * hb)], hb) != 0) ++bad_rows;
    if (!sb) continue;
    if (!c.columns) {
      if (std::memcmp(&got_scales[size_t(r * sb)], &want.scales[size_t(r * sb)], sb) != 0) ++bad_scales;
      continue;
    }
    const bool major = l.receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR;
    const int64_t e = major ? r / l.expert_capacity : 0;
    const int64_t at = major ? r - e * l.expert_capacity : r;
    for (int32_t j = 0; j < l.scale_row_elems; ++j) {
      const size_t x = size_t((e * l.scale_row_elems * column + j * column + at) * 4);
      if (std::memcmp(&got_scales[x], &want.scales[x], 4) != 0) ++bad_scales;
    }
  }
  expect(bad_rows == 0, tag + std::to_string(bad_rows) + " of " + std::to_string(data_rows) + " expert rows differ");
  expect(bad_scales == 0, tag + std::to_string(bad_scales) + " scale entries differ");
  if (call == 0 && std::string(c.name).find("drop") != std::string::npos) {
    expect(want.dropped[0] > 0, tag + "the case drops pairs");
  }

  // The reduction: random expert output (padding rows hold NaN: never read).
  std::vector<uint8_t> expert_output(size_t(rows) * cb);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < l.hidden_size; ++h) {
      const bool pad = want.sources[size_t(r * 3)] < 0;
      const float f = pad ? NAN : std::uniform_real_distribution<float>(-8, 8)(rng);
      store_value(l.combine_dtype, &expert_output[size_t(r) * cb], h, f);
    }
  }
  std::vector<uint8_t> want_out(size_t(receive) * cb, 0xAB);
  moe_ep::reduce_expert_rows(l, hin, want, expert_output.data(), want_out.data());
  uint8_t* d_expert_output = device_copy(expert_output);
  std::vector<uint8_t> poison(size_t(receive) * cb, 0xAB);
  uint8_t* d_out = device_copy(poison);
  check(
      moe_ep::kernels::launch_reduce_expert_rows(shape, din, b, d_expert_output, d_out, blocks, int(call % 2), nullptr),
      "reduce");
  check(cudaDeviceSynchronize(), "reduce");
  const auto got_out = host_copy<uint8_t>(d_out, size_t(receive) * cb);
  int64_t bad_out = 0;
  for (int64_t i = 0; i < receive; ++i) {
    if (std::memcmp(&got_out[size_t(i) * cb], &want_out[size_t(i) * cb], cb) != 0) ++bad_out;
  }
  expect(bad_out == 0, tag + std::to_string(bad_out) + " of " + std::to_string(receive) + " reduced rows differ");

  for (const void* p :
       {din.hidden, din.scales, static_cast<const void*>(din.ids), static_cast<const void*>(din.weights),
        static_cast<const void*>(din.recv_counts), static_cast<const void*>(din.source_tokens),
        static_cast<const void*>(d_expert_output), static_cast<const void*>(d_out)}) {
    if (p) check(cudaFree(const_cast<void*>(p)), "cudaFree");
  }
}

void run_case(const Case& c, std::mt19937_64& rng) {
  moe_ep_params_t p;
  moe_ep_params_init(&p, sizeof p);
  p.num_experts = c.experts;
  p.top_k = c.top_k;
  p.max_tokens_per_rank = c.max_tpr;
  p.hidden_size = c.hidden;
  p.combine_dtype = c.combine;
  p.receive_layout = c.layout;
  p.expert_capacity = c.capacity;
  p.expert_alignment = c.alignment;
  p.expert_rows = c.rows;
  p.expert_output_weighted = c.weighted ? 1 : 0;
  if (c.scales) {
    p.scale_row_elems = c.scales;
    p.scale_layout = c.columns ? MOE_EP_SCALES_COLUMN_MAJOR : MOE_EP_SCALES_ROW_MAJOR;
  }
  const moe_ep::Layout l = moe_ep::make_layout(moe_ep::read_params(&p), c.world, c.rank);
  moe_ep::RegionPlanner planner("test expert rows", 256);
  const moe_ep::ExpertRowsOffsets o = moe_ep::place_expert_rows(l, planner);
  char* base = nullptr;
  check(cudaMalloc(reinterpret_cast<void**>(&base), planner.end()), "cudaMalloc expert rows");
  check(cudaMemset(base, 0, planner.end()), "zero expert rows");  // the ticket starts at zero
  for (int call = 0; call < 3; ++call) run_call(c, l, o, base, rng, call);
  check(cudaFree(base), "cudaFree expert rows");
  std::printf("%s: %s\n", c.name, failures == 0 ? "ok" : "failures so far");
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("skipped: no GPU\n");
    return 77;
  }
  const moe_ep_dtype_t bf16 = moe_ep::dtype_bf16(), fp16 = moe_ep::dtype_fp16(), fp32 = moe_ep::dtype_fp32();
  const int32_t P = MOE_EP_LAYOUT_EXPERT_PACKED, M = MOE_EP_LAYOUT_EXPERT_MAJOR;
  const Case cases[] = {
      // name, world, rank, experts, top_k, max_tpr, tpr, hidden, layout, capacity, alignment, rows,
      // combine, scales, columns, weights, weighted
      {"packed bf16 align 128", 2, 1, 16, 4, 64, 64, 256, P, 0, 128, 0, bf16, 0, 0, true, false},
      {"packed fp32 align 1 scales", 4, 2, 32, 8, 40, 33, 72, P, 0, 1, 0, fp32, 4, 0, true, false},
      {"packed fp16 column scales", 2, 0, 8, 2, 50, 50, 136, P, 0, 16, 0, fp16, 3, 1, false, false},
      {"packed drop rows bound", 2, 0, 8, 4, 64, 64, 64, P, 0, 32, 64, bf16, 2, 1, true, false},
      {"major bf16 weighted", 2, 0, 8, 3, 48, 48, 128, M, 0, 0, 0, bf16, 0, 0, true, true},
      {"major drop capacity column scales", 3, 1, 12, 4, 32, 20, 40, M, 5, 0, 0, fp32, 2, 1, true, false},
      {"major fp16 odd rows", 1, 0, 4, 2, 37, 37, 9, M, 0, 0, 0, fp16, 1, 0, true, false},
      {"packed top_k 40", 1, 0, 64, 40, 16, 16, 32, P, 0, 8, 0, bf16, 0, 0, true, false},
      {"packed 1024 local experts", 2, 1, 2048, 8, 96, 96, 64, P, 0, 4, 0, bf16, 0, 0, true, false},
      {"major many sources", 8, 5, 64, 6, 24, 24, 48, M, 0, 0, 0, bf16, 0, 0, true, false},
      {"packed many block tiles drop", 4, 3, 8, 2, 700, 650, 32, P, 0, 64, 1024, bf16, 0, 0, true, false},
      {"major many block tiles", 4, 0, 16, 5, 600, 555, 16, M, 0, 0, 0, fp32, 0, 0, false, false},
      {"packed no rows", 2, 0, 8, 2, 16, 0, 64, P, 0, 4, 0, bf16, 0, 0, true, false},
  };
  std::mt19937_64 rng(std::random_device{}());
  for (const Case& c : cases) run_case(c, rng);
  std::printf("%s (%d failures)\n", failures == 0 ? "PASSED" : "FAILED", failures);
  return failures == 0 ? 0 : 1;
}
