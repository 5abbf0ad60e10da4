#include "gpu/peer_segments_copy.hpp"

#include "common/cuda_check.hpp"

namespace moe_ep {

void copy_peer_segments(char* view, const char* expert_output, int32_t rank, int32_t world, size_t segment_bytes,
                        cudaStream_t stream) {
  const size_t r = static_cast<size_t>(rank), w = static_cast<size_t>(world);
  if (r > 0) {
    check_cuda(cudaMemcpyAsync(view, expert_output, r * segment_bytes, cudaMemcpyDeviceToDevice, stream),
               "copying expert_output into the combine_input view");
  }
  if (r + 1 < w) {
    const size_t after = (r + 1) * segment_bytes;
    check_cuda(cudaMemcpyAsync(view + after, expert_output + after, (w - r - 1) * segment_bytes,
                               cudaMemcpyDeviceToDevice, stream),
               "copying expert_output into the combine_input view");
  }
}

}  // namespace moe_ep
