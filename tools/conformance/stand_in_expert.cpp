#include "stand_in_expert.hpp"

#include <vector>

#include "dtypes.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

std::string stand_in_expert_refusal(const WorkloadSpec& s) {
  if (!is_float_dtype(s.hidden_dtype) || s.scale_row_elems != 0) {
    return "--decode-step needs a bf16, fp16 or fp32 payload without scales (--dtype), got " +
           dtype_name(s.hidden_dtype) + (s.scale_row_elems ? " with scales" : "");
  }
  if (!is_float_dtype(s.combine_dtype)) return "--decode-step needs a bf16, fp16 or fp32 --combine-dtype";
  if (s.row_elems() != s.hidden_size) return "--decode-step needs one payload element per hidden unit";
  return "";
}

StandInExpertArgs stand_in_expert_args(const WorkloadSpec& s, const moe_ep_dispatch_result_t& r, void* out) {
  StandInExpertArgs a;
  a.rows = r.hidden_states.data;
  a.rows_dtype = s.hidden_dtype;
  a.recv_counts = static_cast<const int32_t*>(r.recv_counts.data);
  a.out = out;
  a.out_dtype = s.combine_dtype;
  a.world = s.world;
  a.tokens_per_rank = s.tokens_per_rank();
  a.hidden = s.hidden_size;
  return a;
}

void run_stand_in_expert_host(const StandInExpertArgs& a) {
  const int64_t rows = int64_t(a.world) * a.tokens_per_rank;
  for (int64_t row = 0; row < rows; ++row) {
    if (!is_received_row(row, a.tokens_per_rank, a.recv_counts)) continue;
    for (int h = 0; h < a.hidden; ++h) {
      const int64_t i = row * a.hidden + h;
      store_float(a.out_dtype, a.out, i, stand_in_expert_value(load_float(a.rows_dtype, a.rows, i)));
    }
  }
}

ExpertRowModel stand_in_expert_model(const WorkloadSpec& s, int me) {
  return [s, me](int, int64_t, int token, float* out) {
    std::vector<uint8_t> row(s.hidden_row_bytes());
    fill_hidden_row(s, me, token, row.data());  // the payload the token carried to every expert rank
    uint32_t rounded[1];
    for (int h = 0; h < s.hidden_size; ++h) {
      store_float(s.combine_dtype, rounded, 0, stand_in_expert_value(load_float(s.hidden_dtype, row.data(), h)));
      out[h] = load_float(s.combine_dtype, rounded, 0);
    }
  };
}

}  // namespace moe_ep_tool
