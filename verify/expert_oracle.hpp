// The expert layouts' part of the oracle (oracle.hpp holds the public entry
// points, which come here when spec.receive_layout is not RANK_MAJOR).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "oracle.hpp"
#include "workload.hpp"

namespace moe_ep_verify {

// Column-major scales: elements of the tensor, and where element j of expert
// row `row` is ([S, rows rounded up to 4] or [E_local, S, capacity rounded up to 4]).
int64_t column_scale_elems(const WorkloadSpec& spec);
int64_t column_scale_index(const WorkloadSpec& spec, int64_t row, int j);

// Fills the expected payload of expert row `row` holding token `token` of `src`
// (hidden: hidden_row_bytes; scales: the row's scale bytes, row-major or the S fp32 in order).
using ExpertRowBytes =
    std::function<void(int64_t row, int src, int token, std::vector<uint8_t>& hidden, std::vector<uint8_t>& scales)>;

void check_expert_fields(Verdict& v, const WorkloadSpec& spec, const ExpertPlacement& placement,
                         const ReceivedDispatch& got);
void compare_expert_payload(Verdict& v, const WorkloadSpec& spec, const std::vector<int32_t>& sources,
                            const ExpertRowBytes& expected_row, const ReceivedDispatch& got);
Verdict check_expert_dispatch(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                              const ReceivedDispatch& got);
Verdict compare_expert_dispatch(const WorkloadSpec& spec, const ReceivedDispatch& reference,
                                const ReceivedDispatch& got);
Verdict check_expert_combine(const WorkloadSpec& spec, const std::vector<RankRouting>& all, int me,
                             const std::vector<uint8_t>& output, const ExpertRowModel& expert_rows);

}  // namespace moe_ep_verify
