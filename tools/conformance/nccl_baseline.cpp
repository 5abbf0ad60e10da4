#include "nccl_baseline.hpp"

#include <nccl.h>

#include <cstdlib>

#include "errors.hpp"

namespace moe_ep_tool {

namespace {

void check_nccl(ncclResult_t rc, const char* call) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  throw ToolError(std::string(call) + " failed: " + ncclGetErrorString(rc));
}
#define TOOL_CHECK_NCCL(call) check_nccl((call), #call)

}  // namespace

struct NcclBaseline::State {
  const Session* s = nullptr;
  ncclComm_t comm = nullptr;
  char* send = nullptr;  // world segments of max_rows_per_peer rows, packed per peer
  char* receive = nullptr;
  int32_t* send_counts = nullptr;  // device [world]
  int32_t* recv_counts = nullptr;  // device [world]
  int32_t* host_counts = nullptr;  // pinned [world]
  uint64_t segment_bytes = 0;
};

bool NcclBaseline::compiled() { return true; }

std::string NcclBaseline::version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "?";
  // NCCL_VERSION_CODE is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

NcclBaseline::NcclBaseline(const Session& s, int64_t max_rows_per_peer, uint64_t max_row_bytes)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.s = &s;
  const World& w = s.world();
  // NVLink multicast (NVLS) must stay off on the test machines; p2p never needs it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  if (w.is_root()) TOOL_CHECK_NCCL(ncclGetUniqueId(&id));
  w.broadcast(&id, sizeof id, 0);
  TOOL_CHECK_NCCL(ncclCommInitRank(&st.comm, w.size, id, w.rank));
  st.segment_bytes = uint64_t(max_rows_per_peer) * max_row_bytes;
  const uint64_t bytes = st.segment_bytes * w.size + 1;
  TOOL_CHECK_CUDA(cudaMalloc(&st.send, bytes));
  TOOL_CHECK_CUDA(cudaMalloc(&st.receive, bytes));
  TOOL_CHECK_CUDA(cudaMemset(st.send, 0x3C, bytes));
  TOOL_CHECK_CUDA(cudaMalloc(&st.send_counts, sizeof(int32_t) * w.size));
  TOOL_CHECK_CUDA(cudaMalloc(&st.recv_counts, sizeof(int32_t) * w.size));
  TOOL_CHECK_CUDA(cudaHostAlloc(&st.host_counts, sizeof(int32_t) * w.size, cudaHostAllocDefault));
}

NcclBaseline::~NcclBaseline() {
  State& st = *state_;
  cudaDeviceSynchronize();
  if (st.comm) ncclCommDestroy(st.comm);
  cudaFree(st.send);
  cudaFree(st.receive);
  cudaFree(st.send_counts);
  cudaFree(st.recv_counts);
  cudaFreeHost(st.host_counts);
}

NcclDispatchTiming NcclBaseline::time_dispatch(const LoopOptions& options, const Traffic& t) {
  State& st = *state_;
  const World& w = st.s->world();
  const auto stream = static_cast<cudaStream_t>(st.s->stream());
  const uint64_t B = t.dispatch_row_bytes;
  std::vector<int32_t> counts(w.size);
  for (int d = 0; d < w.size; ++d) counts[d] = int32_t(t.rows_between(w.rank, d));
  TOOL_CHECK_CUDA(cudaMemcpy(st.send_counts, counts.data(), sizeof(int32_t) * w.size, cudaMemcpyHostToDevice));

  NcclDispatchTiming out;
  LoopOptions ungated = options;
  ungated.gated = false;  // the host waits for the counts inside every iteration
  const LoopResult r = time_loop(*st.s, ungated, 3, [&](Marks& m) {
    m.mark();
    TOOL_CHECK_NCCL(ncclGroupStart());
    for (int p = 0; p < w.size; ++p) {
      TOOL_CHECK_NCCL(ncclSend(st.send_counts + p, 1, ncclInt32, p, st.comm, stream));
      TOOL_CHECK_NCCL(ncclRecv(st.recv_counts + p, 1, ncclInt32, p, st.comm, stream));
    }
    TOOL_CHECK_NCCL(ncclGroupEnd());
    TOOL_CHECK_CUDA(cudaMemcpyAsync(st.host_counts, st.recv_counts, sizeof(int32_t) * w.size, cudaMemcpyDeviceToHost,
                                    stream));
    m.mark();
    TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
    m.hold();  // queue the payload behind a gate, so its time is not the host's launch time
    m.mark();
    TOOL_CHECK_NCCL(ncclGroupStart());
    for (int p = 0; p < w.size; ++p) {
      TOOL_CHECK_NCCL(ncclSend(st.send + p * st.segment_bytes, counts[p] * B, ncclChar, p, st.comm, stream));
      TOOL_CHECK_NCCL(ncclRecv(st.receive + p * st.segment_bytes, uint64_t(st.host_counts[p]) * B, ncclChar, p,
                               st.comm, stream));
    }
    TOOL_CHECK_NCCL(ncclGroupEnd());
    m.mark();
    m.release();
  });
  out.counts.phase_us = {r.phase_us[0]};
  out.payload.phase_us = {r.phase_us[2]};
  for (int p = 0; p < w.size; ++p) out.wrong_counts += st.host_counts[p] != t.rows_between(p, w.rank);
  return out;
}

LoopResult NcclBaseline::time_combine(const LoopOptions& options, const Traffic& t) {
  State& st = *state_;
  const World& w = st.s->world();
  const auto stream = static_cast<cudaStream_t>(st.s->stream());
  const uint64_t B = t.combine_row_bytes;
  return time_loop(*st.s, options, 1, [&](Marks& m) {
    m.mark();
    TOOL_CHECK_NCCL(ncclGroupStart());
    for (int p = 0; p < w.size; ++p) {  // rows received from p go back to p
      TOOL_CHECK_NCCL(ncclSend(st.receive + p * st.segment_bytes, t.rows_between(p, w.rank) * B, ncclChar, p, st.comm,
                               stream));
      TOOL_CHECK_NCCL(ncclRecv(st.send + p * st.segment_bytes, t.rows_between(w.rank, p) * B, ncclChar, p, st.comm,
                               stream));
    }
    TOOL_CHECK_NCCL(ncclGroupEnd());
    m.mark();
  });
}

}  // namespace moe_ep_tool
