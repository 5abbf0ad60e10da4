#include "host_case_runner.hpp"

#include <cstring>

#include "tensor_helpers.hpp"

namespace moe_ep_test {

namespace {

template <typename T>
std::vector<T> copy_view(const moe_ep_tensor_t& t) {
  if (t.data == nullptr) return {};
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  const auto* p = reinterpret_cast<const T*>(static_cast<const char*>(t.data) + t.byte_offset);
  return std::vector<T>(p, p + n);
}

std::vector<uint8_t> copy_bytes(const moe_ep_tensor_t& t) {
  if (t.data == nullptr) return {};
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  const uint64_t bytes = (uint64_t(n) * t.dtype.bits * t.dtype.lanes + 7) / 8;
  const auto* p = static_cast<const uint8_t*>(t.data) + t.byte_offset;
  return std::vector<uint8_t>(p, p + bytes);
}

}  // namespace

CaseOutcome run_host_case(const CaseSpec& spec, const moe_ep_bootstrap_t& bootstrap, int repeats, int32_t backend) {
  CaseOutcome out;
  const int rank = bootstrap.rank;
  auto record = [&](moe_ep_status_t s) {
    if (s != MOE_EP_SUCCESS && out.status == MOE_EP_SUCCESS) {
      out.status = s;
      out.message = moe_ep_last_error();
    }
    return s == MOE_EP_SUCCESS;
  };
  moe_ep_params_t params = spec.params();
  moe_ep_config_t config;
  moe_ep_config_init(&config);
  config.backend = backend;
  moe_ep_handle_t h = nullptr;
  if (!record(moe_ep_create(&bootstrap, &params, &config, &h))) return out;

  const RankData data = make_rank_data(spec, rank);
  const int64_t T = data.num_tokens;
  for (int round = 0; round < repeats; ++round) {
    TensorRef hidden(data.hidden.data(), spec.hidden_dtype, {T, spec.row_elems()});
    TensorRef ids(data.topk_ids.data(), int32_dtype(), {T, spec.top_k});
    TensorRef weights(data.topk_weights.data(), fp32_dtype(), {T, spec.top_k});
    TensorRef scales(data.scales.data(), spec.scale_dtype, {T, spec.scale_row_elems});
    TensorRef eplb(data.eplb_local.data(), int32_dtype(), {spec.num_experts});
    moe_ep_dispatch_args_t args;
    moe_ep_dispatch_args_init(&args);
    args.hidden_states = hidden.get();
    args.topk_ids = ids.get();
    args.topk_weights = spec.with_weights ? weights.get() : nullptr;
    args.hidden_states_scale = spec.scale_row_elems ? scales.get() : nullptr;
    args.runtime_max_tokens_per_rank = spec.runtime_max_tokens_per_rank;
    args.eplb_local_stats = spec.pass_eplb_local ? eplb.get() : nullptr;
    moe_ep_dispatch_result_t res;
    moe_ep_dispatch_result_init(&res);
    if (!record(moe_ep_dispatch(h, &args, &res, nullptr))) break;

    out.tokens_per_rank = res.tokens_per_rank;
    out.received.recv_counts = copy_view<int32_t>(res.recv_counts);
    out.received.topk_ids = copy_view<int32_t>(res.topk_ids);
    out.received.local_expert_counts = copy_view<int32_t>(res.local_expert_counts);
    out.received.eplb_gathered = copy_view<int32_t>(res.eplb_gathered_stats);
    out.received.has_weights = res.topk_weights.data != nullptr;
    out.received.topk_weights = copy_view<float>(res.topk_weights);
    out.received.hidden = copy_bytes(res.hidden_states);
    out.received.scales = copy_bytes(res.hidden_states_scale);

    const std::vector<uint8_t> expert_output = make_expert_output(spec, rank, round == repeats - 1 ? 0 : round + 1);
    TensorRef eo(expert_output.data(), spec.combine_dtype,
                 {int64_t(spec.world_size) * res.tokens_per_rank, spec.hidden_size});
    moe_ep_combine_result_t cres;
    moe_ep_combine_result_init(&cres);
    if (!record(moe_ep_combine(h, eo.get(), nullptr, &cres, nullptr))) break;
    out.combined = copy_bytes(cres.output);
  }
  moe_ep_status_t async = MOE_EP_SUCCESS;
  record(moe_ep_get_async_error(h, &async));
  record(async);
  record(moe_ep_destroy(&h));
  return out;
}

std::string check_case(const CaseSpec& spec, int rank, const CaseOutcome& outcome) {
  if (outcome.status != MOE_EP_SUCCESS) {
    return std::string(moe_ep_status_string(outcome.status)) + ": " + outcome.message;
  }
  std::vector<RankData> all;
  for (int r = 0; r < spec.world_size; ++r) all.push_back(make_rank_data(spec, r));
  std::string diff = compare_receive(spec, brute_force_receive(spec, all, rank), outcome.received);
  if (outcome.tokens_per_rank != spec.tokens_per_rank()) diff += "tokens_per_rank differs\n";
  std::vector<std::vector<uint8_t>> outputs;
  for (int r = 0; r < spec.world_size; ++r) outputs.push_back(make_expert_output(spec, r, 0));
  // The last round always uses salt 0 (earlier rounds use other values).
  const std::vector<uint8_t> expected = brute_force_combine(spec, all, outputs, rank);
  if (expected != outcome.combined) diff += "combine output differs\n";
  return diff;
}

}  // namespace moe_ep_test
