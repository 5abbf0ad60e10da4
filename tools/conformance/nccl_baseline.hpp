// NCCL moving the same routing as moe_ep, the way an EP layer built on NCCL
// does it:
//   dispatch = count exchange (grouped ncclSend/ncclRecv of one int32 per
//              peer) + copy of the counts to the host (the host must know them
//              to post the receives) + grouped ncclSend/ncclRecv of the rows;
//   combine  = grouped ncclSend/ncclRecv of the same rows back.
// The rows are already packed per destination and nothing is reduced, so the
// figures are NCCL's transport alone: a lower bound for an NCCL-based layer.
// NCCL is loaded at run time (dlopen of the library the NCCL backend loads:
// MOE_EP_NCCL_LIBRARY, else libnccl.so.2), with only the calls below: the
// tool never links libnccl, and a run without NCCL, or whose ranks share a GPU
// (NCCL refuses that), skips the baseline and says why.
#pragma once

#include <memory>
#include <string>

#include "loop_timer.hpp"
#include "session.hpp"
#include "traffic.hpp"

namespace moe_ep_tool {

struct NcclDispatchTiming {
  LoopResult counts;   // count exchange + device-to-host copy of the counts
  LoopResult payload;  // the rows
  int64_t wrong_counts = 0;  // counts received that differ from the routing
};

class NcclBaseline {
 public:
  // Whether NCCL loads here; *why says why not.  Local.
  static bool available(std::string* why);
  static std::string version();  // "2.28.9", or "not loaded: <why>"
  // Collective: "" when every rank can join an NCCL communicator, else why not
  // (two ranks on one GPU, NCCL missing on a rank).
  static std::string group_refusal(const Session& session);

  // Collective.  Buffers for up to max_rows_per_peer rows of max_row_bytes.
  NcclBaseline(const Session& session, int64_t max_rows_per_peer, uint64_t max_row_bytes);
  ~NcclBaseline();
  NcclBaseline(const NcclBaseline&) = delete;
  NcclBaseline& operator=(const NcclBaseline&) = delete;

  NcclDispatchTiming time_dispatch(const LoopOptions& options, const Traffic& traffic);
  LoopResult time_combine(const LoopOptions& options, const Traffic& traffic);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace moe_ep_tool
