// Copies the peers' segments of a rank-major expert output into a rank's
// combine_input view, in stream order: segments [0, rank) and (rank, world)
// of segment_bytes each (the own segment is read in place by the combine).
// Both GPU backends use it when combine is given an expert_output outside the
// view but must send (NCCL) or be read (NVLink pull) from the view.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace moe_ep {

// Throws CUDA_ERROR.  Sizes are the caller's, checked at create.
void copy_peer_segments(char* view, const char* expert_output, int32_t rank, int32_t world, size_t segment_bytes,
                        cudaStream_t stream);

}  // namespace moe_ep
