// One rank's dispatch/combine pair on the HOST backend (ranks as threads): its
// inputs from moe_ep_verify's workload, and each result checked against the
// oracle.  The first problem found is kept in
// `problems` ("" while every call succeeded and every result matched).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"
#include "workload.hpp"

namespace moe_ep_test {

struct RankPair {
  moe_ep_verify::WorkloadSpec w;
  int rank;
  moe_ep_verify::RankInputs in;
  moe_ep_verify::DispatchArgs args;
  std::vector<uint8_t> expert_output;
  moe_ep_verify::TensorView eo;              // combine's input over expert_output (expert_output_view)
  moe_ep_verify::ReceivedDispatch received;  // the last dispatch result checked
  std::vector<uint8_t> combined;             // the last combine result checked
  std::string problems;

  RankPair(const moe_ep_verify::WorkloadSpec& spec, int r, bool as_3d = false);

  int tokens() const { return in.routing.num_tokens; }
  // Notes the first failing call's status and message; returns s == SUCCESS.
  bool ok(moe_ep_status_t s, const char* call);
  // Against the oracle on `all` (every rank's routing): the unmasked routing
  // unless told, mask_routing's under an active-rank mask.
  void check_dispatch_result(const moe_ep_dispatch_result_t& r);
  void check_dispatch_result(const moe_ep_dispatch_result_t& r, const std::vector<moe_ep_verify::RankRouting>& all);
  void check_combine_result(const moe_ep_combine_result_t& r);
  void check_combine_result(const moe_ep_combine_result_t& r, const std::vector<moe_ep_verify::RankRouting>& all);
};

}  // namespace moe_ep_test
