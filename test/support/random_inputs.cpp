#include "random_inputs.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

#include "dtype.hpp"

namespace moe_ep_test {

namespace {
uint64_t bytes_for(const moe_ep_dtype_t& d, int64_t elems) { return (uint64_t(d.bits) * d.lanes * elems + 7) / 8; }

std::mt19937_64 rng_for(uint64_t seed, int rank, uint64_t salt) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(rank), static_cast<uint32_t>(salt)};
  return std::mt19937_64(seq);
}

int owner(const CaseSpec& s, int32_t id) {
  // Deliberately not id / experts_per_rank: scan the ranges.
  for (int r = 0; r < s.world_size; ++r) {
    if (id >= r * s.experts_per_rank() && id < (r + 1) * s.experts_per_rank()) return r;
  }
  return -1;
}

bool goes_to(const CaseSpec& s, const RankData& d, int t, int dest) {
  for (int k = 0; k < s.top_k; ++k) {
    if (owner(s, d.topk_ids[size_t(t) * s.top_k + k]) == dest) return true;
  }
  return false;
}
}  // namespace

uint64_t CaseSpec::hidden_row_bytes() const { return bytes_for(hidden_dtype, row_elems()); }
uint64_t CaseSpec::scale_row_bytes() const { return scale_row_elems ? bytes_for(scale_dtype, scale_row_elems) : 0; }
uint64_t CaseSpec::combine_row_bytes() const { return bytes_for(combine_dtype, hidden_size); }

std::string CaseSpec::describe() const {
  std::ostringstream os;
  os << "world=" << world_size << " E=" << num_experts << " K=" << top_k << " maxT=" << max_tokens_per_rank
     << " tpr=" << tokens_per_rank() << " H=" << hidden_size << " hidden=" << moe_ep::dtype_name(hidden_dtype)
     << "x" << row_elems() << " scales=" << scale_row_elems << " combine=" << moe_ep::dtype_name(combine_dtype)
     << " weights=" << with_weights << " mask=" << mask_fraction << " eplb=" << eplb_stats
     << " invalid=" << invalid_expert_id << " seed=" << seed << " tokens=[";
  for (size_t i = 0; i < tokens.size(); ++i) os << (i ? "," : "") << tokens[i];
  os << "]";
  return os.str();
}

moe_ep_params_t CaseSpec::params() const {
  moe_ep_params_t p;
  moe_ep_params_init(&p);
  p.num_experts = num_experts;
  p.top_k = top_k;
  p.max_tokens_per_rank = max_tokens_per_rank;
  p.hidden_size = hidden_size;
  p.hidden_dtype = hidden_dtype;
  p.hidden_row_elems = hidden_row_elems;
  p.scale_row_elems = scale_row_elems;
  p.scale_dtype = scale_dtype;
  p.invalid_expert_id = invalid_expert_id;
  p.enable_eplb_stats = eplb_stats ? 1 : 0;
  p.combine_dtype = combine_dtype;
  return p;
}

RankData make_rank_data(const CaseSpec& s, int rank) {
  auto rng = rng_for(s.seed, rank, 0);
  RankData d;
  d.num_tokens = rank < int(s.tokens.size())
                     ? s.tokens[rank]
                     : std::uniform_int_distribution<int>(0, s.tokens_per_rank())(rng);
  const size_t T = d.num_tokens, K = s.top_k;
  d.topk_ids.resize(T * K);
  d.topk_weights.resize(T * K);
  std::vector<int32_t> experts(s.num_experts);
  std::iota(experts.begin(), experts.end(), 0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (size_t t = 0; t < T; ++t) {
    // top_k distinct experts: a partial Fisher-Yates shuffle
    for (size_t k = 0; k < K; ++k) {
      const size_t j = k + std::uniform_int_distribution<size_t>(0, experts.size() - 1 - k)(rng);
      std::swap(experts[k], experts[j]);
      d.topk_ids[t * K + k] = unit(rng) < s.mask_fraction ? s.invalid_expert_id : experts[k];
      d.topk_weights[t * K + k] = static_cast<float>(unit(rng));
    }
  }
  d.hidden.resize(T * s.hidden_row_bytes());
  d.scales.resize(T * s.scale_row_bytes());
  for (auto& b : d.hidden) b = static_cast<uint8_t>(rng());
  for (auto& b : d.scales) b = static_cast<uint8_t>(rng());
  if (s.pass_eplb_local) {
    d.eplb_local.resize(s.num_experts);
    for (auto& v : d.eplb_local) v = std::uniform_int_distribution<int>(0, 1000)(rng);
  }
  return d;
}

std::vector<uint8_t> make_expert_output(const CaseSpec& s, int rank, uint64_t salt) {
  auto rng = rng_for(s.seed, rank, 1000 + salt);
  const size_t rows = size_t(s.world_size) * s.tokens_per_rank();
  std::vector<uint8_t> out(rows * s.combine_row_bytes());
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  for (size_t i = 0; i < rows * size_t(s.hidden_size); ++i) {
    moe_ep::store_from_float(s.combine_dtype, out.data(), static_cast<int64_t>(i), value(rng));
  }
  return out;
}

ExpectedReceive brute_force_receive(const CaseSpec& s, const std::vector<RankData>& all, int dest) {
  const int tpr = s.tokens_per_rank(), K = s.top_k;
  const size_t P = size_t(s.world_size) * tpr;
  ExpectedReceive e;
  e.recv_counts.assign(s.world_size, 0);
  e.topk_ids.assign(P * K, s.invalid_expert_id);
  e.topk_weights.assign(P * K, 0.0f);
  e.hidden.assign(P * s.hidden_row_bytes(), 0);
  e.scales.assign(P * s.scale_row_bytes(), 0);
  e.local_expert_counts.assign(s.experts_per_rank(), 0);
  for (int src = 0; src < s.world_size; ++src) {
    const RankData& d = all[src];
    for (int t = 0; t < d.num_tokens; ++t) {
      if (!goes_to(s, d, t, dest)) continue;
      int earlier = 0;  // earlier tokens of src that also go to dest
      for (int u = 0; u < t; ++u) earlier += goes_to(s, d, u, dest) ? 1 : 0;
      const size_t row = size_t(src) * tpr + earlier;
      e.recv_counts[src]++;
      for (int k = 0; k < K; ++k) {
        const int32_t id = d.topk_ids[size_t(t) * K + k];
        if (owner(s, id) == dest) {
          e.topk_ids[row * K + k] = id;
          e.local_expert_counts[id - dest * s.experts_per_rank()]++;
        }
        e.topk_weights[row * K + k] = d.topk_weights[size_t(t) * K + k];
      }
      std::memcpy(&e.hidden[row * s.hidden_row_bytes()], &d.hidden[size_t(t) * s.hidden_row_bytes()],
                  s.hidden_row_bytes());
      if (s.scale_row_bytes()) {
        std::memcpy(&e.scales[row * s.scale_row_bytes()], &d.scales[size_t(t) * s.scale_row_bytes()],
                    s.scale_row_bytes());
      }
    }
  }
  if (s.eplb_stats) {
    e.eplb_gathered.assign(size_t(s.world_size) * s.num_experts, 0);
    for (int src = 0; src < s.world_size; ++src) {
      for (int x = 0; x < s.num_experts; ++x) {
        int32_t v = 0;
        if (s.pass_eplb_local) {
          v = all[src].eplb_local[x];
        } else {
          for (int32_t id : all[src].topk_ids) v += id == x ? 1 : 0;
        }
        e.eplb_gathered[size_t(src) * s.num_experts + x] = v;
      }
    }
  }
  return e;
}

std::vector<uint8_t> brute_force_combine(const CaseSpec& s, const std::vector<RankData>& all,
                                         const std::vector<std::vector<uint8_t>>& outputs, int source) {
  const RankData& d = all[source];
  const int tpr = s.tokens_per_rank(), H = s.hidden_size;
  std::vector<uint8_t> out(size_t(d.num_tokens) * s.combine_row_bytes());
  for (int t = 0; t < d.num_tokens; ++t) {
    std::vector<float> acc(H, 0.0f);
    for (int r = 0; r < s.world_size; ++r) {
      if (!goes_to(s, d, t, r)) continue;
      int earlier = 0;
      for (int u = 0; u < t; ++u) earlier += goes_to(s, d, u, r) ? 1 : 0;
      const size_t row = size_t(source) * tpr + earlier;
      for (int h = 0; h < H; ++h) {
        acc[h] += moe_ep::load_as_float(s.combine_dtype, outputs[r].data(), int64_t(row) * H + h);
      }
    }
    for (int h = 0; h < H; ++h) moe_ep::store_from_float(s.combine_dtype, out.data(), int64_t(t) * H + h, acc[h]);
  }
  return out;
}

std::string compare_receive(const CaseSpec& s, const ExpectedReceive& e, const ReceivedCopy& g) {
  std::ostringstream os;
  int reported = 0;
  auto note = [&](const std::string& what) {
    if (reported++ < 8) os << what << "\n";
  };
  const int tpr = s.tokens_per_rank(), K = s.top_k;
  if (g.recv_counts != e.recv_counts) note("recv_counts differ");
  if (g.local_expert_counts != e.local_expert_counts) note("local_expert_counts differ");
  if (s.eplb_stats && g.eplb_gathered != e.eplb_gathered) note("eplb_gathered_stats differ");
  if (g.topk_ids.size() != e.topk_ids.size()) {
    note("topk_ids size differs");
  } else {
    for (size_t i = 0; i < e.topk_ids.size(); ++i) {
      if (g.topk_ids[i] != e.topk_ids[i]) {
        note("topk_ids[row " + std::to_string(i / K) + ", pick " + std::to_string(i % K) + "]: expected " +
             std::to_string(e.topk_ids[i]) + ", got " + std::to_string(g.topk_ids[i]));
      }
    }
  }
  if (g.has_weights != s.with_weights) note("weights presence differs");
  if (s.with_weights && g.has_weights) {
    for (size_t i = 0; i < e.topk_weights.size() && i < g.topk_weights.size(); ++i) {
      if (std::memcmp(&g.topk_weights[i], &e.topk_weights[i], sizeof(float)) != 0) {
        note("topk_weights[" + std::to_string(i) + "]: expected " + std::to_string(e.topk_weights[i]) + ", got " +
             std::to_string(g.topk_weights[i]));
      }
    }
  }
  for (int src = 0; src < s.world_size; ++src) {
    for (int j = 0; j < e.recv_counts[src]; ++j) {
      const size_t row = size_t(src) * tpr + j;
      if (g.hidden.size() < (row + 1) * s.hidden_row_bytes() ||
          std::memcmp(&g.hidden[row * s.hidden_row_bytes()], &e.hidden[row * s.hidden_row_bytes()],
                      s.hidden_row_bytes()) != 0) {
        note("hidden row " + std::to_string(row) + " differs");
      }
      if (s.scale_row_bytes() &&
          (g.scales.size() < (row + 1) * s.scale_row_bytes() ||
           std::memcmp(&g.scales[row * s.scale_row_bytes()], &e.scales[row * s.scale_row_bytes()],
                       s.scale_row_bytes()) != 0)) {
        note("scale row " + std::to_string(row) + " differs");
      }
    }
  }
  if (reported > 8) os << "... " << reported - 8 << " more\n";
  return os.str();
}

}  // namespace moe_ep_test
