// The tool's side of the public C API: a handle that is destroyed on scope
// exit, tensor descriptors that own their shapes, one rank's dispatch inputs,
// and reading a dispatch result back (with its shapes and dtypes checked).
#pragma once

#include <initializer_list>

#include "expected.hpp"
#include "memory.hpp"
#include "moe_ep_c.h"
#include "workload.hpp"

namespace moe_ep_tool {

class EpHandle {
 public:
  EpHandle(const moe_ep_bootstrap_t& bootstrap, const moe_ep_params_t& params, const moe_ep_config_t& config);
  ~EpHandle();
  EpHandle(const EpHandle&) = delete;
  EpHandle& operator=(const EpHandle&) = delete;
  moe_ep_handle_t get() const { return handle_; }

 private:
  moe_ep_handle_t handle_ = nullptr;
};

// A moe_ep_tensor_t whose shape array lives as long as it does.
class Tensor {
 public:
  Tensor(void* data, const moe_ep_device_t& device, const moe_ep_dtype_t& dtype, std::initializer_list<int64_t> dims);
  const moe_ep_tensor_t* get() {
    tensor_.shape = shape_;  // re-pointed on every use: copies stay valid
    return &tensor_;
  }

 private:
  moe_ep_tensor_t tensor_{};
  int64_t shape_[4] = {};
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
  int num_tokens() const { return num_tokens_; }

 private:
  Place place_;
  Buffer hidden_, ids_, weights_, scales_, eplb_;
  int num_tokens_ = 0;
};

// Combine of the dispatch just issued.  expert_output holds [P, H] rows of
// combine_dtype, passed as [P, H] or, with as_3d, as [world, tpr, H]; output
// NULL asks for library-owned memory.
moe_ep_status_t run_combine(moe_ep_handle_t handle, const WorkloadSpec& spec, const Place& place,
                            const Buffer& expert_output, bool as_3d, const Buffer* output, int num_tokens,
                            moe_ep_combine_result_t* result, void* stream);

// Shape, dtype and device of every result tensor are checked against the
// spec (each mismatch is one wrong element); then the contents are copied.
ReceivedDispatch read_dispatch(const WorkloadSpec& spec, const Place& place, const moe_ep_dispatch_result_t& result,
                               void* stream, Verdict& verdict);
// Overwrites the payload rows of a dispatch result (hidden, scales): the
// caller may use them until it issues the combine, so a later dispatch must
// rewrite every row it reports.
void poison_dispatch_payload(const WorkloadSpec& spec, const Place& place, const moe_ep_dispatch_result_t& result,
                             void* stream);
std::vector<uint8_t> read_combine(const WorkloadSpec& spec, const Place& place, const moe_ep_combine_result_t& result,
                                  int num_tokens, void* stream, Verdict& verdict);

}  // namespace moe_ep_tool
