// A single moe_ep call captured into a CUDA graph, replayed on demand: how an
// inference server runs dispatch and combine under CUDA graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "errors.hpp"

namespace moe_ep_tool {

class CapturedCall {
 public:
  // Captures call(stream) (which returns a moe_ep status, or throws) in
  // global capture mode, the strictest one (PyTorch's default): any forbidden
  // call inside the library fails the capture.
  template <typename Call>
  CapturedCall(void* stream, Call&& call) {
    const auto s = static_cast<cudaStream_t>(stream);
    TOOL_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    moe_ep_status_t status = MOE_EP_SUCCESS;
    try {
      status = std::forward<Call>(call)(stream);
    } catch (...) {  // never leave the stream capturing
      cudaGraph_t partial = nullptr;
      cudaStreamEndCapture(s, &partial);
      if (partial) cudaGraphDestroy(partial);
      throw;
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s, &graph);  // always end, even after a failure
    if (status != MOE_EP_SUCCESS) {
      if (graph) cudaGraphDestroy(graph);
      throw MoeEpError(status, std::string("captured call returned ") + moe_ep_status_string(status) + ": " +
                                   moe_ep_last_error());
    }
    check_cuda(ended, "cudaStreamEndCapture", __FILE__, __LINE__);
    const cudaError_t built = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(built, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  ~CapturedCall() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;

  void launch(void* stream) const { TOOL_CHECK_CUDA(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream))); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace moe_ep_tool
