// `moe_ep_conformance check`: runs the case matrix against the host-side
// expectation and reports #wrong per case; non-zero exit on any wrong element.
#pragma once

#include <string>

#include "mpi_world.hpp"
#include "session.hpp"

namespace moe_ep_tool {

struct CheckOptions {
  CommonOptions common;
  int rounds = 2;              // eager calls per case on one handle, fresh inputs each
  std::string filter;          // run only cases whose name contains this
  std::string modes = "auto";  // eager | graph | both | auto (both on GPU, eager on host)
  bool poison_results = true;  // overwrite dispatch payload results before combine
  bool list = false;           // print the case names and exit
  std::string inject_fault = "none";  // self-test of the checker (fault_injection.hpp)
};

int run_check(const World& world, const CheckOptions& options);

}  // namespace moe_ep_tool
