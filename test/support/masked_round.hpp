// One dispatch/combine pair on a HOST handle whose mask may change under it
// (failure_policy MASK), checked against moe_ep_verify's oracle run on the
// same inputs with the routing masked by the handle's mask at dispatch
// (mask_routing): what the survivors of a failure must get, row for row.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "moe_ep_c.h"
#include "result_reader.hpp"
#include "tensor_view.hpp"
#include "workload.hpp"

namespace moe_ep_test {

struct MaskedRound {
  moe_ep_status_t status = MOE_EP_SUCCESS;  // of the first call that failed
  std::string error;                        // its message
  int64_t wrong = 0;                        // entries that differ from the oracle
  std::string details;
  std::vector<uint8_t> mask;  // the mask the round ran under
  // Every call succeeded, but the health poll after the results were read
  // reports a failure the next call recovers from (an asynchronous backend
  // under failure_policy MASK): the round's results are not valid.
  bool pending = false;
};

// Where a round's tensors live: the host (the default), or a GPU, through
// the caller's copies into memory it owns.
struct RoundMemory {
  moe_ep_device_t device{MOE_EP_DEVICE_CPU, 0};
  // Places this round's inputs and expert output where the handle reads
  // them; returns the inputs' addresses and the expert output's.
  std::function<const void*(const moe_ep_verify::RankInputs& in, const std::vector<uint8_t>& expert_output,
                            moe_ep_verify::DispatchMemory* inputs)>
      place;
  moe_ep_verify::MemoryReader read;  // reads results back to the host
};
RoundMemory host_round_memory();

// Records in r the first call that failed (its status and message); returns
// whether `s` is SUCCESS.
bool note_call(MaskedRound& r, moe_ep_status_t s, const char* call);

MaskedRound run_masked_round(moe_ep_handle_t h, const moe_ep_verify::WorkloadSpec& w, int rank,
                             const RoundMemory& memory = host_round_memory());

// moe_ep_poll_health's report on h; `status` (if given) gets the poll's own
// status.
moe_ep_health_t poll_health(moe_ep_handle_t h, moe_ep_status_t* status = nullptr);

// A HOST config with failure_policy MASK over the store at `address` (the
// strings must outlive the create call).
moe_ep_config_t mask_config(const char* address, const char* prefix, int32_t timeout_ms);

}  // namespace moe_ep_test
