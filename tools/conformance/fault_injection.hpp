// Self-test of the checker: --inject-fault corrupts, on rank 0, the host copy
// of a result before it is compared, so that a test can prove that `check`
// notices a wrong byte, a wrong row order, a wrong count or a wrong sum (a
// checker that never fails proves nothing).
#pragma once

#include <string>
#include <vector>

#include "expected.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

enum class Fault { none, dispatch_payload, dispatch_order, recv_counts, combine_output };

Fault parse_fault(const std::string& name);

// Each returns whether it found something to corrupt.
bool inject_fault(Fault fault, const WorkloadSpec& spec, ReceivedDispatch& got);
bool inject_fault(Fault fault, const WorkloadSpec& spec, std::vector<uint8_t>& combine_output);

}  // namespace moe_ep_tool
