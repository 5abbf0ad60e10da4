// The tool's side of the public C API: a handle that is destroyed on scope
// exit, one rank's dispatch inputs in tool-owned buffers, combine, and the
// poisoning of results.  Views and result reading come from moe_ep_verify.
#pragma once

#include "memory.hpp"
#include "moe_ep_c.h"
#include "oracle.hpp"
#include "result_reader.hpp"
#include "tensor_view.hpp"
#include "workload.hpp"

namespace moe_ep_tool {

using namespace moe_ep_verify;

class EpHandle {
 public:
  EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params, const moe_ep_config_t& config);
  // As above, except that create's answer `tolerated` is not a tool error: the
  // handle is then NULL and *status says so (the message is moe_ep_last_error()).
  EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params, const moe_ep_config_t& config,
           moe_ep_status_t tolerated, moe_ep_status_t* status);
  ~EpHandle();
  EpHandle(const EpHandle&) = delete;
  EpHandle& operator=(const EpHandle&) = delete;
  moe_ep_handle_t get() const { return handle_; }

 private:
  moe_ep_handle_t handle_ = nullptr;
};

// One rank's dispatch inputs, in buffers sized for max_tokens_per_rank rows,
// so that a captured graph can be replayed on new contents.
class DispatchInputs {
 public:
  DispatchInputs(const WorkloadSpec& spec, const Place& place);
  // Regenerates rank `rank`'s inputs for spec (same T for graph replays).
  void load(const WorkloadSpec& spec, int rank, const RankRouting& routing, void* stream);
  moe_ep_status_t dispatch(moe_ep_handle_t handle, const WorkloadSpec& spec, moe_ep_dispatch_result_t* result,
                           void* stream);
  // The send half on buffer slot `slot` (docs/overlap.md).
  moe_ep_status_t dispatch_send(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& spec, void* stream);
  int num_tokens() const { return num_tokens_; }
  // The payload buffers dispatch reads (bench --wire quantize+as_is writes its rows there).
  void* hidden() const { return hidden_.data(); }
  void* scales() const { return scales_.data(); }

 private:
  Place place_;
  Buffer hidden_, ids_, weights_, scales_, eplb_;
  int num_tokens_ = 0;
};

// Combine of the dispatch just issued.  expert_output holds [P, H] rows of
// combine_dtype (a tool buffer, or the dispatch result's combine_input view),
// passed as [P, H] or, with as_3d, as [world, tpr, H]; output NULL asks for
// library-owned memory.
moe_ep_status_t run_combine(moe_ep_handle_t handle, const WorkloadSpec& spec, const Place& place,
                            const void* expert_output, bool as_3d, const Buffer* output, int num_tokens,
                            moe_ep_combine_result_t* result, void* stream);

// The halves of combine on buffer slot `slot`, with the same tensors as run_combine.
moe_ep_status_t run_combine_send(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& spec, const Place& place,
                                 const void* expert_output, bool as_3d, void* stream);
moe_ep_status_t run_combine_recv(moe_ep_handle_t handle, int32_t slot, const WorkloadSpec& spec, const Place& place,
                                 const Buffer* output, int num_tokens, moe_ep_combine_result_t* result, void* stream);

// The config a handle of this run uses, with config->zero_copy_combine set as asked.
moe_ep_config_t with_zero_copy_combine(moe_ep_config_t config, bool zero_copy);

// Zero-copy combine: writes rank `rank`'s expert output for `spec` into the
// dispatch result's combine_input view and returns the view's address.
// Fails (a tool error) when the result has no view.  With every rank's
// routing `all`, an expert layout's view gets its pair rows only, NaN
// elsewhere (write_expert_layout_output); without, every row.
void* fill_combine_input(const WorkloadSpec& spec, int rank, const Place& place, const moe_ep_dispatch_result_t& result,
                         void* stream, const std::vector<RankRouting>* all = nullptr);

// Overwrites the payload rows of a dispatch result (hidden, scales): the
// caller may use them until it issues the combine, so a later dispatch must
// rewrite every row it reports.
void poison_dispatch_payload(const WorkloadSpec& spec, const Place& place, const moe_ep_dispatch_result_t& result,
                             void* stream);

}  // namespace moe_ep_tool
