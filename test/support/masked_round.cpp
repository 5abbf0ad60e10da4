#include "masked_round.hpp"

#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"

namespace moe_ep_test {

using namespace moe_ep_verify;

bool note_call(MaskedRound& r, moe_ep_status_t s, const char* call) {
  if (s != MOE_EP_SUCCESS && r.status == MOE_EP_SUCCESS) {
    r.status = s;
    r.error = std::string(call) + ": " + moe_ep_status_string(s) + ": " + moe_ep_last_error();
  }
  return s == MOE_EP_SUCCESS;
}

RoundMemory host_round_memory() {
  RoundMemory m;
  m.device = host_device();
  m.place = [](const RankInputs& in, const std::vector<uint8_t>& expert_output, DispatchMemory* inputs) {
    *inputs = host_memory(in);
    return static_cast<const void*>(expert_output.data());
  };
  m.read = read_host_memory;
  return m;
}

MaskedRound run_masked_round(moe_ep_handle_t h, const WorkloadSpec& w, int rank, const RoundMemory& memory) {
  MaskedRound r;
  r.mask.assign(size_t(w.world), 0);
  if (!note_call(r, moe_ep_get_active_ranks(h, r.mask.data(), w.world), "moe_ep_get_active_ranks")) return r;
  const std::vector<RankRouting> masked = mask_routing(w, make_all_routing(w), r.mask);
  const RankInputs in = make_rank_inputs(w, rank);  // unmasked: the library masks it
  const std::vector<uint8_t> expert_output = make_expert_output(w, rank);
  DispatchMemory inputs;
  const void* expert_output_data = memory.place(in, expert_output, &inputs);
  DispatchArgs args(w, in.routing.num_tokens, inputs, memory.device);
  moe_ep_dispatch_result_t dr;
  moe_ep_dispatch_result_init(&dr, sizeof dr);
  if (!note_call(r, moe_ep_dispatch(h, args.get(), &dr, nullptr), "moe_ep_dispatch")) return r;
  Verdict v;
  const ReceivedDispatch got = read_dispatch(w, dr, memory.device, memory.read, v);
  v.merge(check_dispatch(w, masked, rank, got));
  const TensorView eo = expert_output_view(w, expert_output_data, memory.device, false);
  moe_ep_combine_result_t cr;
  moe_ep_combine_result_init(&cr, sizeof cr);
  if (note_call(r, moe_ep_combine(h, eo.get(), nullptr, &cr, nullptr), "moe_ep_combine")) {
    const std::vector<uint8_t> out = read_combine(w, cr, in.routing.num_tokens, memory.device, memory.read, v);
    if (in.routing.num_tokens > 0) v.merge(check_combine(w, masked, rank, out));
  }
  r.wrong = v.wrong;
  r.details = v.details;
  if (r.status == MOE_EP_SUCCESS) {  // the results were read: every kernel of the round has ended
    const moe_ep_health_t health = poll_health(h);
    if (health.status != MOE_EP_SUCCESS) {
      r.status = health.status;
      r.error = std::string("health after the round: ") + moe_ep_last_error();
      r.pending = true;
    }
  }
  return r;
}

moe_ep_health_t poll_health(moe_ep_handle_t h, moe_ep_status_t* status) {
  moe_ep_health_t health;
  moe_ep_health_init(&health, sizeof health);
  const moe_ep_status_t s = moe_ep_poll_health(h, &health);
  if (status) *status = s;
  return health;
}

moe_ep_config_t mask_config(const char* address, const char* prefix, int32_t timeout_ms) {
  moe_ep_config_t c;
  moe_ep_config_init(&c, sizeof c);
  c.backend = MOE_EP_BACKEND_HOST;
  c.timeout_ms = timeout_ms;
  c.failure_policy = MOE_EP_ON_FAILURE_MASK;
  c.store_address = address;
  c.store_prefix = prefix;
  return c;
}

}  // namespace moe_ep_test
