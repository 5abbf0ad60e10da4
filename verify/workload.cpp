#include "workload.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "counter_rng.hpp"
#include "dtypes.hpp"
#include "wire_oracle.hpp"

namespace moe_ep_verify {

namespace {
// Purposes of the random streams derived from (seed, rank).
enum Stream : uint64_t { kRouting = 1, kHidden = 2, kScales = 3, kExpertOutput = 4, kEplb = 5, kTokenCount = 6 };

uint64_t stream_key(const WorkloadSpec& s, int rank, Stream purpose) {
  return derive(derive(s.seed, static_cast<uint64_t>(rank)), purpose);
}

// Distinct experts for one token, in pick order.
void pick_uniform(const WorkloadSpec& s, Sequence& seq, int32_t* out) {
  const int E = s.num_experts, K = s.top_k;
  if (4 * K <= E) {  // few picks: rejection is cheap
    for (int k = 0; k < K; ++k) {
      int32_t e;
      do e = static_cast<int32_t>(seq.below(E));
      while (std::find(out, out + k, e) != out + k);
      out[k] = e;
    }
    return;
  }
  std::vector<int32_t> all(E);  // many picks: a partial Fisher-Yates shuffle
  std::iota(all.begin(), all.end(), 0);
  for (int k = 0; k < K; ++k) {
    std::swap(all[k], all[k + seq.below(E - k)]);
    out[k] = all[k];
  }
}

// Perfect balance: over any E consecutive tokens every expert is picked K
// times, and a token's picks are spread E/K apart, so over the ranks too.
void pick_balanced(const WorkloadSpec& s, int rank, int token, int32_t* out) {
  const int E = s.num_experts, K = s.top_k;
  const int64_t global = int64_t(rank) * s.tokens_per_rank() + token;
  const int stride = std::max(1, E / K);
  for (int k = 0; k < K; ++k) out[k] = static_cast<int32_t>((global + int64_t(k) * stride) % E);
}

void pick_zipf(const WorkloadSpec& s, const std::vector<double>& cdf, Sequence& seq, int32_t* out) {
  const int K = s.top_k;
  for (int k = 0; k < K; ++k) {
    int32_t e;
    do {
      const double u = seq.unit() * cdf.back();
      e = static_cast<int32_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      e = std::min(e, s.num_experts - 1);
    } while (std::find(out, out + k, e) != out + k);
    out[k] = e;
  }
}

// An id that is neither valid nor the invalid id: bad device data.
int32_t bad_id(const WorkloadSpec& s, uint64_t r) {
  const int32_t candidates[3] = {s.num_experts + static_cast<int32_t>(r % 97), -2 - static_cast<int32_t>(r % 89),
                                 s.num_experts + 1000};
  for (int32_t c : candidates) {
    if (c != s.invalid_expert_id) return c;
  }
  return s.num_experts + 1001;
}
}  // namespace

RoutingKind parse_routing(const std::string& name) {
  if (name == "uniform") return RoutingKind::uniform;
  if (name == "balanced") return RoutingKind::balanced;
  if (name == "zipf") return RoutingKind::zipf;
  throw std::invalid_argument("unknown routing '" + name + "' (expected uniform, balanced or zipf)");
}

std::string routing_name(RoutingKind kind) {
  switch (kind) {
    case RoutingKind::uniform: return "uniform";
    case RoutingKind::balanced: return "balanced";
    case RoutingKind::zipf: return "zipf";
  }
  return "?";
}

uint64_t WorkloadSpec::hidden_row_bytes() const { return row_bytes(hidden_dtype, row_elems()); }
uint64_t WorkloadSpec::scale_row_bytes() const { return scale_row_elems ? row_bytes(scale_dtype, scale_row_elems) : 0; }
uint64_t WorkloadSpec::combine_row_bytes() const { return row_bytes(combine_dtype, hidden_size); }
moe_ep_dtype_t WorkloadSpec::recv_hidden_dtype() const { return wire_scales() ? fp8_e4m3_dtype() : hidden_dtype; }
uint64_t WorkloadSpec::recv_hidden_row_bytes() const { return row_bytes(recv_hidden_dtype(), row_elems()); }
int WorkloadSpec::recv_scale_row_elems() const {
  return wire_scales() ? oracle_wire_blocks(row_elems()) : fp8_dispatch() ? 0 : scale_row_elems;
}
moe_ep_dtype_t WorkloadSpec::recv_scale_dtype() const { return wire_scales() ? fp32_dtype() : scale_dtype; }
uint64_t WorkloadSpec::recv_scale_row_bytes() const {
  return recv_scale_row_elems() ? row_bytes(recv_scale_dtype(), recv_scale_row_elems()) : 0;
}

int WorkloadSpec::owner(int32_t id) const {
  for (int r = 0; r < world; ++r) {
    if (id >= r * experts_per_rank() && id < (r + 1) * experts_per_rank()) return r;
  }
  return -1;
}

int WorkloadSpec::num_tokens(int rank) const {
  if (!tokens.empty()) return tokens.at(rank);
  return static_cast<int>(draw(stream_key(*this, rank, kTokenCount), 0) % uint64_t(tokens_per_rank() + 1));
}

moe_ep_params_t required_params(int32_t num_experts, int32_t top_k, int32_t max_tokens_per_rank, int32_t hidden_size) {
  moe_ep_params_t p;
  moe_ep_params_init(&p, sizeof p);
  p.num_experts = num_experts;
  p.top_k = top_k;
  p.max_tokens_per_rank = max_tokens_per_rank;
  p.hidden_size = hidden_size;
  return p;
}

moe_ep_params_t WorkloadSpec::params() const {
  moe_ep_params_t p = required_params(num_experts, top_k, max_tokens_per_rank, hidden_size);
  p.hidden_dtype = hidden_dtype;
  p.hidden_row_elems = hidden_row_elems;
  p.scale_row_elems = scale_row_elems;
  p.scale_dtype = scale_dtype;
  p.invalid_expert_id = invalid_expert_id;
  p.enable_eplb_stats = eplb_stats ? 1 : 0;
  p.combine_dtype = combine_dtype;
  p.receive_layout = receive_layout;
  p.expert_capacity = expert_capacity;
  p.expert_alignment = expert_alignment;
  p.expert_rows = expert_rows;
  p.expert_output_weighted = expert_output_weighted ? 1 : 0;
  p.scale_layout = scale_layout;
  p.dispatch_wire = dispatch_wire;
  p.combine_wire = combine_wire;
  p.wire_scale = wire_scale;
  p.dispatch_dequantize = dispatch_dequantize ? 1 : 0;
  return p;
}

int WorkloadSpec::capacity() const {
  if (receive_layout != MOE_EP_LAYOUT_EXPERT_MAJOR) return 0;
  return expert_capacity ? expert_capacity : world * max_tokens_per_rank;
}

int WorkloadSpec::alignment() const { return expert_alignment ? expert_alignment : 1; }

int64_t WorkloadSpec::packed_rows() const {
  if (receive_layout != MOE_EP_LAYOUT_EXPERT_PACKED) return 0;
  if (expert_rows) return expert_rows;
  // Every received token brings at most min(top_k, E_local) distinct local
  // experts, and each expert at most alignment - 1 rows of padding; the
  // aligned total is a multiple of the alignment.
  const int64_t a = alignment();
  const int64_t worst = int64_t(world) * max_tokens_per_rank * std::min(top_k, experts_per_rank()) +
                        int64_t(experts_per_rank()) * (a - 1);
  return worst - worst % a;
}

int64_t WorkloadSpec::expert_layout_rows() const {
  if (receive_layout == MOE_EP_LAYOUT_EXPERT_MAJOR) return int64_t(experts_per_rank()) * capacity();
  return packed_rows();
}

std::string WorkloadSpec::describe() const {
  std::ostringstream os;
  os << "world=" << world << " E=" << num_experts << " K=" << top_k << " maxT=" << max_tokens_per_rank
     << " tpr=" << tokens_per_rank() << " H=" << hidden_size << " hidden=" << dtype_name(hidden_dtype) << "x"
     << row_elems() << " scales=" << scale_row_elems << " combine=" << dtype_name(combine_dtype)
     << " weights=" << weights << " eplb=" << eplb_stats << (eplb_given ? "(given)" : "")
     << " invalid=" << invalid_expert_id << " routing=" << routing_name(routing.kind)
     << " mask=" << routing.mask_fraction << " bad=" << routing.bad_fraction << " layout=" << receive_layout
     << " cap=" << expert_capacity << " align=" << expert_alignment << " rows=" << expert_rows
     << " weighted=" << expert_output_weighted << " scale_layout=" << scale_layout << " dispatch_wire=" << dispatch_wire
     << " combine_wire=" << combine_wire << " wire_scale=" << wire_scale << " dequantize=" << dispatch_dequantize
     << " seed=" << seed << " tokens=[";
  for (int r = 0; r < world; ++r) os << (r ? "," : "") << num_tokens(r);
  os << "]";
  return os.str();
}

RankRouting make_routing(const WorkloadSpec& s, int rank) {
  RankRouting r;
  r.num_tokens = s.num_tokens(rank);
  const size_t K = s.top_k;
  r.topk_ids.resize(size_t(r.num_tokens) * K);
  r.topk_weights.resize(size_t(r.num_tokens) * K);
  std::vector<double> cdf;
  if (s.routing.kind == RoutingKind::zipf) {
    double total = 0;
    for (int e = 0; e < s.num_experts; ++e) cdf.push_back(total += std::pow(e + 1.0, -s.routing.zipf_s));
  }
  const uint64_t key = stream_key(s, rank, kRouting);
  for (int t = 0; t < r.num_tokens; ++t) {
    Sequence seq(derive(key, static_cast<uint64_t>(t)));
    int32_t* ids = &r.topk_ids[size_t(t) * K];
    switch (s.routing.kind) {
      case RoutingKind::uniform: pick_uniform(s, seq, ids); break;
      case RoutingKind::balanced: pick_balanced(s, rank, t, ids); break;
      case RoutingKind::zipf: pick_zipf(s, cdf, seq, ids); break;
    }
    for (size_t k = 0; k < K; ++k) {
      if (seq.unit() < s.routing.mask_fraction) ids[k] = s.invalid_expert_id;
      if (seq.unit() < s.routing.bad_fraction) ids[k] = bad_id(s, seq.next());
      r.topk_weights[size_t(t) * K + k] = static_cast<float>(seq.unit());
    }
  }
  return r;
}

std::vector<RankRouting> make_all_routing(const WorkloadSpec& s) {
  std::vector<RankRouting> all;
  for (int r = 0; r < s.world; ++r) all.push_back(make_routing(s, r));
  return all;
}

std::vector<RankRouting> mask_routing(const WorkloadSpec& s, std::vector<RankRouting> all,
                                      const std::vector<uint8_t>& active) {
  for (int src = 0; src < s.world; ++src) {
    for (int32_t& id : all[size_t(src)].topk_ids) {
      const int dest = s.owner(id);  // -1 for an id outside [0, E)
      if (dest < 0) continue;
      if (!active[size_t(src)] || !active[size_t(dest)]) id = s.invalid_expert_id;
    }
  }
  return all;
}

bool goes_to(const WorkloadSpec& s, const RankRouting& routing, int token, int dest) {
  const int32_t* ids = &routing.topk_ids[size_t(token) * s.top_k];
  for (int k = 0; k < s.top_k; ++k) {
    if (s.owner(ids[k]) == dest) return true;
  }
  return false;
}

namespace {
void fill_random_bytes(uint64_t key, uint8_t* out, uint64_t bytes) {
  uint64_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    const uint64_t v = draw(key, i / 8);
    for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  const uint64_t v = draw(key, i / 8);
  for (int b = 0; i + b < bytes; ++b) out[i + b] = static_cast<uint8_t>(v >> (8 * b));
}
}  // namespace

void fill_hidden_row(const WorkloadSpec& s, int rank, int token, uint8_t* out) {
  const uint64_t key = derive(stream_key(s, rank, kHidden), static_cast<uint64_t>(token));
  if (!s.fp8_dispatch()) {  // rows travel opaque: any bytes
    fill_random_bytes(key, out, s.hidden_row_bytes());
    return;
  }
  // Rows an FP8 wire quantizes: values in [-2, 2) times 2^[-8, 8), so that
  // blocks mix magnitudes (small values become e4m3 subnormals), and one
  // element in 256 NaN, +-Inf or -0.
  const int n = s.row_elems();
  std::vector<uint8_t> bits(size_t(n) * 4);
  fill_random_bytes(key, bits.data(), bits.size());
  for (int i = 0; i < n; ++i) {
    uint32_t u = 0;
    std::memcpy(&u, &bits[size_t(i) * 4], 4);
    float x = std::ldexp(float(u & 0xFFFF) / 16384.0f - 2.0f, int((u >> 16) & 15) - 8);
    if (((u >> 20) & 0xFF) == 0) {
      const float specials[4] = {std::nanf(""), HUGE_VALF, -HUGE_VALF, -0.0f};
      x = specials[(u >> 28) & 3];
    }
    store_float(s.hidden_dtype, out, i, x);
  }
}

void fill_received_row(const WorkloadSpec& s, int rank, int token, uint8_t* hidden, uint8_t* scales) {
  if (!s.fp8_dispatch()) {
    fill_hidden_row(s, rank, token, hidden);
    if (s.scale_row_elems) fill_scale_row(s, rank, token, scales);
    return;
  }
  const int n = s.row_elems();
  std::vector<uint8_t> row(s.hidden_row_bytes()), codes(static_cast<size_t>(n));
  std::vector<float> block_scales(static_cast<size_t>(oracle_wire_blocks(n)));
  fill_hidden_row(s, rank, token, row.data());
  oracle_quantize_row(s.hidden_dtype, row.data(), n, static_cast<WireScale>(s.wire_scale), codes.data(),
                      block_scales.data());
  if (s.dispatch_dequantize) {
    for (int i = 0; i < n; ++i) {
      store_float(s.hidden_dtype, hidden, i, oracle_dequantize(codes[size_t(i)], block_scales[size_t(i) / 128]));
    }
    return;
  }
  std::memcpy(hidden, codes.data(), codes.size());
  std::memcpy(scales, block_scales.data(), block_scales.size() * sizeof(float));
}

void fill_scale_row(const WorkloadSpec& s, int rank, int token, uint8_t* out) {
  fill_random_bytes(derive(stream_key(s, rank, kScales), static_cast<uint64_t>(token)), out, s.scale_row_bytes());
}

std::vector<uint8_t> make_hidden(const WorkloadSpec& s, int rank) {
  const int T = s.num_tokens(rank);
  std::vector<uint8_t> out(size_t(T) * s.hidden_row_bytes());
  for (int t = 0; t < T; ++t) fill_hidden_row(s, rank, t, out.data() + size_t(t) * s.hidden_row_bytes());
  return out;
}

std::vector<uint8_t> make_scales(const WorkloadSpec& s, int rank) {
  const int T = s.num_tokens(rank);
  std::vector<uint8_t> out(size_t(T) * s.scale_row_bytes());
  for (int t = 0; t < T && s.scale_row_bytes(); ++t) fill_scale_row(s, rank, t, out.data() + size_t(t) * s.scale_row_bytes());
  return out;
}

RankInputs make_rank_inputs(const WorkloadSpec& s, int rank) {
  RankInputs in;
  in.routing = make_routing(s, rank);
  in.hidden = make_hidden(s, rank);
  in.scales = make_scales(s, rank);
  if (s.eplb_given) in.eplb_local = make_eplb_local(s, rank);
  return in;
}

std::vector<int32_t> make_eplb_local(const WorkloadSpec& s, int rank) {
  std::vector<int32_t> out(s.num_experts);
  const uint64_t key = stream_key(s, rank, kEplb);
  for (int e = 0; e < s.num_experts; ++e) out[e] = static_cast<int32_t>(draw(key, e) % 100000);
  return out;
}

float expert_output_value(const WorkloadSpec& s, int rank, int64_t row, int h) {
  const uint64_t key = stream_key(s, rank, kExpertOutput);
  const double u = draw_unit(key, static_cast<uint64_t>(row) * s.hidden_size + h);
  uint32_t bits[1];
  float v = static_cast<float>(4.0 * u - 2.0);
  store_float(s.combine_dtype, bits, 0, v);  // round to what the tensor can hold
  return load_float(s.combine_dtype, bits, 0);
}

std::vector<uint8_t> make_expert_output(const WorkloadSpec& s, int rank) {
  const int64_t P = s.combine_rows();
  std::vector<uint8_t> out(P * s.combine_row_bytes());
  for (int64_t row = 0; row < P; ++row) {
    for (int h = 0; h < s.hidden_size; ++h) {
      store_float(s.combine_dtype, out.data(), row * s.hidden_size + h, expert_output_value(s, rank, row, h));
    }
  }
  return out;
}

}  // namespace moe_ep_verify
