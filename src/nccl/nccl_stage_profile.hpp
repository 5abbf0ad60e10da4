// MOE_EP_NCCL_PROFILE=1: where the GPU time of the NCCL backend's calls goes.
// Timing events are recorded between the stages of eager calls (never inside a
// CUDA graph capture) and read only at destroy, which logs the mean time of
// each stage through MOE_EP_LOG=info.  A diagnostic: off by default.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

namespace moe_ep {

class NcclStageProfile {
 public:
  // `name` names the call ("dispatch"), `stages` the intervals between marks.
  NcclStageProfile(std::string name, std::vector<std::string> stages);
  ~NcclStageProfile();
  NcclStageProfile(const NcclStageProfile&) = delete;
  NcclStageProfile& operator=(const NcclStageProfile&) = delete;

  static bool enabled();  // MOE_EP_NCCL_PROFILE=1

  // Marks the start of a call (mark 0) and the end of each stage (marks 1..n).
  void begin(cudaStream_t stream);
  void mark(cudaStream_t stream);
  // Mean milliseconds per stage over the recorded calls, as one log line.
  std::string summary();

 private:
  std::string name_;
  std::vector<std::string> stages_;
  std::vector<std::vector<cudaEvent_t>> calls_;  // per call, one event per mark
  bool active_ = false;
};

}  // namespace moe_ep
