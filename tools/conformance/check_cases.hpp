// The conformance matrix (issue 4): each case is a workload shape that
// exercises one rule of SPEC §4, instantiated for the job's world size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workload.hpp"

namespace moe_ep_tool {

enum class TokenRule {
  random,      // each rank: uniform in [0, tokens_per_rank]
  full,        // each rank: tokens_per_rank
  zero,        // every rank: 0
  rank0_zero,  // rank 0: 0, the others: tokens_per_rank
  unequal,     // rank r: (5r + 3) mod (tokens_per_rank + 1), all different for small worlds
};

struct CheckCase {
  std::string name;
  WorkloadSpec shape;          // world, num_experts, tokens and seed are set per run
  int experts_per_rank = 4;    // num_experts = experts_per_rank * world ...
  int min_experts = 0;         // ... rounded up to at least this (a multiple of world)
  bool top_k_is_all = false;   // top_k = num_experts
  bool invalid_above = false;  // invalid_expert_id = num_experts + 5 (a positive invalid id)
  TokenRule tokens = TokenRule::random;
};

std::vector<CheckCase> check_cases();

// The case for this world; `seed` drives routing and payload, `count_seed`
// the token counts (fixed across graph replays, which need a fixed T).
WorkloadSpec instantiate(const CheckCase& c, int world, uint64_t seed, uint64_t count_seed);

}  // namespace moe_ep_tool
