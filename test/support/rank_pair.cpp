#include "rank_pair.hpp"

namespace moe_ep_test {

using namespace moe_ep_verify;

RankPair::RankPair(const WorkloadSpec& spec, int r, bool as_3d)
    : w(spec),
      rank(r),
      in(make_rank_inputs(w, r)),
      args(w, in.routing.num_tokens, host_memory(in)),
      expert_output(make_expert_output(w, r)),
      eo(expert_output_view(w, expert_output.data(), host_device(), as_3d)) {}

bool RankPair::ok(moe_ep_status_t s, const char* call) {
  if (s != MOE_EP_SUCCESS && problems.empty()) {
    problems = std::string(call) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error();
  }
  return s == MOE_EP_SUCCESS;
}

void RankPair::check_dispatch_result(const moe_ep_dispatch_result_t& r) {
  check_dispatch_result(r, make_all_routing(w));
}

void RankPair::check_dispatch_result(const moe_ep_dispatch_result_t& r, const std::vector<RankRouting>& all) {
  Verdict v;
  received = read_dispatch(w, r, host_device(), read_host_memory, v);
  v.merge(check_dispatch(w, all, rank, received));
  if (v.wrong && problems.empty()) problems = "dispatch: " + w.describe() + "\n" + v.details;
}

void RankPair::check_combine_result(const moe_ep_combine_result_t& r) { check_combine_result(r, make_all_routing(w)); }

void RankPair::check_combine_result(const moe_ep_combine_result_t& r, const std::vector<RankRouting>& all) {
  Verdict v;
  combined = read_combine(w, r, tokens(), host_device(), read_host_memory, v);
  if (tokens() > 0) v.merge(check_combine(w, all, rank, combined));
  if (v.wrong && problems.empty()) problems = "combine: " + w.describe() + "\n" + v.details;
}

}  // namespace moe_ep_test
