#include "nccl/nccl_stage_profile.hpp"

#include <cstdio>

#include "common/tuning_registry.hpp"

namespace moe_ep {

namespace {
constexpr size_t kMaxCalls = 512;  // later calls are not recorded
}

NcclStageProfile::NcclStageProfile(std::string name, std::vector<std::string> stages)
    : name_(std::move(name)), stages_(std::move(stages)) {}

NcclStageProfile::~NcclStageProfile() {
  for (auto& call : calls_) {
    for (cudaEvent_t e : call) cudaEventDestroy(e);
  }
}

bool NcclStageProfile::enabled() { return knob_bool(Knob::kNcclProfile); }

void NcclStageProfile::begin(cudaStream_t stream) {
  active_ = false;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (calls_.size() >= kMaxCalls || cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return;
  }
  calls_.emplace_back();
  active_ = true;
  mark(stream);
}

void NcclStageProfile::mark(cudaStream_t stream) {
  if (!active_) return;
  cudaEvent_t e = nullptr;
  if (cudaEventCreate(&e) != cudaSuccess) {
    cudaGetLastError();
    active_ = false;
    return;
  }
  cudaEventRecord(e, stream);
  calls_.back().push_back(e);
}

std::string NcclStageProfile::summary() {
  std::vector<double> sum(stages_.size(), 0.0);
  size_t used = 0, misshapen = 0;
  for (auto& call : calls_) {
    if (call.size() != stages_.size() + 1) {
      ++misshapen;  // a path that marks its stages differently: say so rather than average it
      continue;
    }
    if (cudaEventSynchronize(call.back()) != cudaSuccess) continue;
    ++used;
    for (size_t i = 0; i < stages_.size(); ++i) {
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, call[i], call[i + 1]);
      sum[i] += ms;
    }
  }
  cudaGetLastError();
  std::string line = name_ + " stages, mean of " + std::to_string(used) + " eager calls";
  if (misshapen > 0) {
    line += " (" + std::to_string(misshapen) + " calls left out: their marks do not match the " +
            std::to_string(stages_.size()) + " stages)";
  }
  line += ":";
  for (size_t i = 0; i < stages_.size(); ++i) {
    char part[96];
    std::snprintf(part, sizeof part, " %s %.1f us", stages_[i].c_str(), used ? 1000.0 * sum[i] / used : 0.0);
    line += part;
  }
  return line;
}

}  // namespace moe_ep
