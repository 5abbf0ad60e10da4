// Runs one workload through a HOST-backend handle on one rank (any bootstrap):
// every round on fresh inputs, every result checked against the oracle of
// moe_ep_verify (independent of the library's reference model).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_test {

using moe_ep_verify::WorkloadSpec;

struct CaseOutcome {
  std::string problems;           // "" when every call succeeded and every round matched the oracle
  std::vector<uint8_t> combined;  // the last round's combine output, [T, hidden] of combine_dtype
};

// The workload of round `round`: the spec itself in round 0, then fresh
// routing, payload, expert outputs (and token counts, when the spec leaves
// them to the seed) in every later round.
WorkloadSpec round_spec(const WorkloadSpec& spec, int round);

// Collective: every rank of `bootstrap` calls it with the same spec.  Runs
// `rounds` dispatch/combine pairs on one handle.  Odd rounds combine into a
// caller tensor poisoned with 0xFF (every element must be written), even
// rounds into library-owned memory; after each dispatch is checked, its payload
// results are overwritten with 0xA5 (the next dispatch must rewrite them).
CaseOutcome run_host_case(const WorkloadSpec& spec, const moe_ep_bootstrap_t& bootstrap, int rounds = 1);

}  // namespace moe_ep_test
