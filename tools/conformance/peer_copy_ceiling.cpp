#include "peer_copy_ceiling.hpp"

#include "errors.hpp"

namespace moe_ep_tool {

bool PeerCopyCeiling::available(const Session& s) {
  return s.on_gpu() && s.world().size > 1 && s.world().single_host();
}

PeerCopyCeiling::PeerCopyCeiling(const Session& s, uint64_t max_bytes_per_peer)
    : s_(s), slot_bytes_(max_bytes_per_peer ? max_bytes_per_peer : 1) {
  const World& w = s.world();
  TOOL_CHECK_CUDA(cudaMalloc(&send_, slot_bytes_));
  TOOL_CHECK_CUDA(cudaMemset(send_, 0x3C, slot_bytes_));
  TOOL_CHECK_CUDA(cudaMalloc(&receive_, slot_bytes_ * w.size));
  cudaIpcMemHandle_t mine;
  TOOL_CHECK_CUDA(cudaIpcGetMemHandle(&mine, receive_));
  std::vector<cudaIpcMemHandle_t> all(w.size);
  TOOL_CHECK_MPI(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, w.comm));
  peer_receive_.assign(w.size, nullptr);
  streams_.assign(w.size, nullptr);
  fork_.assign(w.size, nullptr);
  join_.assign(w.size, nullptr);
  for (int d = 0; d < w.size; ++d) {
    if (d == w.rank) continue;
    TOOL_CHECK_CUDA(cudaIpcOpenMemHandle(&peer_receive_[d], all[d], cudaIpcMemLazyEnablePeerAccess));
    TOOL_CHECK_CUDA(cudaStreamCreateWithFlags(&streams_[d], cudaStreamNonBlocking));
    TOOL_CHECK_CUDA(cudaEventCreateWithFlags(&fork_[d], cudaEventDisableTiming));
    TOOL_CHECK_CUDA(cudaEventCreateWithFlags(&join_[d], cudaEventDisableTiming));
  }
  w.barrier();
}

PeerCopyCeiling::~PeerCopyCeiling() {
  // Peers may still be copying into our buffer: wait for everyone first.
  cudaDeviceSynchronize();
  MPI_Barrier(s_.world().comm);
  for (size_t d = 0; d < peer_receive_.size(); ++d) {
    if (peer_receive_[d]) cudaIpcCloseMemHandle(peer_receive_[d]);
    if (streams_[d]) cudaStreamDestroy(streams_[d]);
    if (fork_[d]) cudaEventDestroy(fork_[d]);
    if (join_[d]) cudaEventDestroy(join_[d]);
  }
  MPI_Barrier(s_.world().comm);
  cudaFree(send_);
  cudaFree(receive_);
}

void PeerCopyCeiling::copy_all(const std::vector<uint64_t>& bytes_to) {
  const auto main = static_cast<cudaStream_t>(s_.stream());
  const int me = s_.world().rank;
  const bool one_peer = s_.world().size == 2;  // no fork/join: nothing to overlap
  for (int d = 0; d < s_.world().size; ++d) {
    if (d == me || bytes_to[d] == 0) continue;
    if (bytes_to[d] > slot_bytes_) fail("peer-copy ceiling: more bytes than allocated");
    char* target = static_cast<char*>(peer_receive_[d]) + uint64_t(me) * slot_bytes_;
    if (one_peer) {
      TOOL_CHECK_CUDA(cudaMemcpyAsync(target, send_, bytes_to[d], cudaMemcpyDeviceToDevice, main));
      continue;
    }
    TOOL_CHECK_CUDA(cudaEventRecord(fork_[d], main));
    TOOL_CHECK_CUDA(cudaStreamWaitEvent(streams_[d], fork_[d], 0));
    TOOL_CHECK_CUDA(cudaMemcpyAsync(target, send_, bytes_to[d], cudaMemcpyDeviceToDevice, streams_[d]));
    TOOL_CHECK_CUDA(cudaEventRecord(join_[d], streams_[d]));
    TOOL_CHECK_CUDA(cudaStreamWaitEvent(main, join_[d], 0));
  }
}

LoopResult PeerCopyCeiling::time(const LoopOptions& options, const std::vector<uint64_t>& bytes_to) {
  return time_loop(s_, options, 1, [&](Marks& m) {
    m.mark();
    copy_all(bytes_to);
    m.mark();
  });
}

}  // namespace moe_ep_tool
