// Runs one CaseSpec through a HOST-backend handle on one rank (any bootstrap)
// and returns host copies of everything it produced, for comparison with the
// brute-force model.
#pragma once

#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "random_inputs.hpp"

namespace moe_ep_test {

struct CaseOutcome {
  moe_ep_status_t status = MOE_EP_SUCCESS;  // first failing call's status
  std::string message;                      // and its message
  ReceivedCopy received;
  std::vector<uint8_t> combined;            // [T, hidden] combine_dtype
  int32_t tokens_per_rank = 0;
};

// Collective: every rank of `bootstrap` calls it with the same spec.
// `repeats` dispatch/combine rounds are run; the last one is returned.
CaseOutcome run_host_case(const CaseSpec& spec, const moe_ep_bootstrap_t& bootstrap, int repeats = 1,
                          int32_t backend = MOE_EP_BACKEND_HOST);

// Checks one rank's outcome against the model; "" when all matches.
std::string check_case(const CaseSpec& spec, int rank, const CaseOutcome& outcome);

}  // namespace moe_ep_test
