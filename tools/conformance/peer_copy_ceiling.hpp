// The peer-copy ceiling: what the copy engines reach when every rank copies,
// at the same moment, exactly the bytes it sends each peer in a phase into
// that peer's memory (cudaIpc-mapped buffers, cudaMemcpyAsync, one stream per
// peer, so both directions of every link are busy at once).  It does no
// routing, packing or signalling: a bound, not a competitor.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "loop_timer.hpp"
#include "session.hpp"

namespace moe_ep_tool {

class PeerCopyCeiling {
 public:
  // Needs the GPU backend, more than one rank, all ranks on one host.
  static bool available(const Session& session);
  // Collective: allocates max_bytes_per_peer per peer and maps the peers' buffers.
  PeerCopyCeiling(const Session& session, uint64_t max_bytes_per_peer);
  ~PeerCopyCeiling();
  PeerCopyCeiling(const PeerCopyCeiling&) = delete;
  PeerCopyCeiling& operator=(const PeerCopyCeiling&) = delete;

  // bytes_to[d]: what this rank copies to rank d (its own entry is ignored).
  LoopResult time(const LoopOptions& options, const std::vector<uint64_t>& bytes_to);

 private:
  void copy_all(const std::vector<uint64_t>& bytes_to);

  const Session& s_;
  uint64_t slot_bytes_;
  void* send_ = nullptr;
  void* receive_ = nullptr;            // world slots, slot r written by rank r
  std::vector<void*> peer_receive_;    // mapped receive buffers of the peers
  std::vector<cudaStream_t> streams_;  // one per peer
  std::vector<cudaEvent_t> fork_, join_;
};

}  // namespace moe_ep_tool
