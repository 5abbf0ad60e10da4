#include "host_case_runner.hpp"

#include <cstring>

#include "counter_rng.hpp"
#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"

namespace moe_ep_test {

using namespace moe_ep_verify;

WorkloadSpec round_spec(const WorkloadSpec& spec, int round) {
  WorkloadSpec w = spec;
  if (round > 0) w.seed = derive(spec.seed, uint64_t(round));
  return w;
}

namespace {

// The first failing call's status and message, in words.
class CallLog {
 public:
  bool ok(moe_ep_status_t s, const char* call) {
    if (s != MOE_EP_SUCCESS && text_.empty()) {
      text_ = std::string(call) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error() + "\n";
    }
    return s == MOE_EP_SUCCESS;
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

void poison_payload(const WorkloadSpec& w, const moe_ep_dispatch_result_t& r) {
  const uint64_t P = uint64_t(w.receive_rows());
  if (r.hidden_states.data) std::memset(r.hidden_states.data, 0xA5, P * w.hidden_row_bytes());
  if (r.hidden_states_scale.data) std::memset(r.hidden_states_scale.data, 0xA5, P * w.scale_row_bytes());
}

// One round on handle h; returns the oracle's findings ("" = all matched).
std::string run_round(moe_ep_handle_t h, const WorkloadSpec& w, int rank, bool caller_output, CallLog& log,
                      std::vector<uint8_t>& combined) {
  const RankInputs in = make_rank_inputs(w, rank);
  const int T = in.routing.num_tokens;
  DispatchArgs args(w, T, host_memory(in));
  moe_ep_dispatch_result_t dr;
  moe_ep_dispatch_result_init(&dr, sizeof dr);
  if (!log.ok(moe_ep_dispatch(h, args.get(), &dr, nullptr), "moe_ep_dispatch")) return log.text();

  const std::vector<RankRouting> all = make_all_routing(w);
  Verdict v;
  const ReceivedDispatch got = read_dispatch(w, dr, host_device(), read_host_memory, v);
  v.merge(check_dispatch(w, all, rank, got));
  poison_payload(w, dr);

  const std::vector<uint8_t> expert_output = make_expert_output(w, rank);
  std::vector<uint8_t> output(size_t(T) * w.combine_row_bytes(), 0xFF);
  const TensorView eo = expert_output_view(w, expert_output.data(), host_device());
  const TensorView out = combine_output_view(w, output.data(), T, host_device());
  moe_ep_combine_result_t cr;
  moe_ep_combine_result_init(&cr, sizeof cr);
  if (!log.ok(moe_ep_combine(h, eo.get(), caller_output ? out.get() : nullptr, &cr, nullptr), "moe_ep_combine")) {
    return log.text();
  }
  if (caller_output && T > 0 && cr.output.data != output.data()) v.add(1, "combine: result is not the caller's tensor");
  combined = read_combine(w, cr, T, host_device(), read_host_memory, v);
  if (T > 0) v.merge(check_combine(w, all, rank, combined));
  return v.wrong ? std::to_string(v.wrong) + " wrong: " + w.describe() + "\n" + v.details : "";
}

}  // namespace

CaseOutcome run_host_case(const WorkloadSpec& spec, const moe_ep_bootstrap_t& bootstrap, int rounds) {
  CaseOutcome out;
  CallLog log;
  moe_ep_params_t params = spec.params();
  moe_ep_config_t config;
  moe_ep_config_init(&config, sizeof config);
  config.backend = MOE_EP_BACKEND_HOST;
  moe_ep_handle_t h = nullptr;
  if (!log.ok(moe_ep_create(&bootstrap, &params, &config, &h), "moe_ep_create")) {
    out.problems = log.text();
    return out;
  }
  for (int round = 0; round < rounds && log.text().empty(); ++round) {
    const std::string found = run_round(h, round_spec(spec, round), bootstrap.rank, round % 2 == 1, log, out.combined);
    if (!found.empty()) out.problems += "round " + std::to_string(round) + ": " + found;
  }
  moe_ep_status_t async = MOE_EP_SUCCESS;
  log.ok(moe_ep_get_async_error(h, &async), "moe_ep_get_async_error");
  log.ok(async, "asynchronous error");
  log.ok(moe_ep_destroy(&h), "moe_ep_destroy");
  if (out.problems.find(log.text()) == std::string::npos) out.problems += log.text();
  return out;
}

}  // namespace moe_ep_test
