// The workload the multi-rank HOST cases start from, and a fresh seed per run
// (a test prints it with every failure, so that a failing run can be replayed).
#pragma once

#include <cstdint>
#include <random>

#include "workload.hpp"

namespace moe_ep_test {

inline uint64_t fresh_seed() {
  static std::random_device device;
  return (uint64_t(device()) << 32) ^ device();
}

// Four experts per rank, top-3 routing, 9 tokens a rank of 24 bf16 values;
// each case changes what it tests from there.
inline moe_ep_verify::WorkloadSpec small_workload(int world, uint64_t seed) {
  moe_ep_verify::WorkloadSpec w;
  w.world = world;
  w.num_experts = 4 * world;
  w.top_k = 3;
  w.max_tokens_per_rank = 9;
  w.hidden_size = 24;
  w.seed = seed;
  return w;
}

}  // namespace moe_ep_test
