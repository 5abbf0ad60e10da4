#include "side_streams.hpp"

#include "errors.hpp"

namespace moe_ep_tool {

namespace {
// More than any one body records between two uses of the same event.
constexpr int kEvents = 16;
}  // namespace

SideStreams::SideStreams(const Session& s) {
  if (!s.on_gpu()) return;
  int least = 0, greatest = 0;
  TOOL_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TOOL_CHECK_CUDA(cudaStreamCreateWithPriority(&comm_, cudaStreamNonBlocking, greatest));
  TOOL_CHECK_CUDA(cudaStreamCreateWithPriority(&compute_, cudaStreamNonBlocking, least));
  events_.resize(kEvents);
  for (cudaEvent_t& e : events_) TOOL_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
}

SideStreams::~SideStreams() {
  for (cudaEvent_t e : events_) {
    if (e) cudaEventDestroy(e);
  }
  if (comm_) cudaStreamDestroy(comm_);
  if (compute_) cudaStreamDestroy(compute_);
}

void SideStreams::follow(void* waiter, void* leader) {
  if (events_.empty()) return;
  cudaEvent_t e = events_[next_++ % events_.size()];
  TOOL_CHECK_CUDA(cudaEventRecord(e, static_cast<cudaStream_t>(leader)));
  TOOL_CHECK_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0));
}

}  // namespace moe_ep_tool
