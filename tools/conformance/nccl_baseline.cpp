#include "nccl_baseline.hpp"

#include <cuda_runtime.h>  // the typed cudaMalloc overloads

#include <cstdlib>
#include <functional>

#include "errors.hpp"
#include "nccl/nccl_library.hpp"

namespace moe_ep_tool {

namespace {

namespace nccl = moe_ep::nccl;

const nccl::Api& api() {
  std::string why;
  const nccl::Api* a = nccl::load(&why);
  if (a == nullptr) throw ToolError(why);
  return *a;
}

void check_nccl(nccl::Result rc, const char* call) {
  if (rc == nccl::kSuccess || rc == nccl::kInProgress) return;
  throw ToolError(std::string(call) + " failed: " + api().GetErrorString(rc));
}
#define TOOL_CHECK_NCCL(call) check_nccl((call), #call)


}  // namespace

struct NcclBaseline::State {
  const Session* s = nullptr;
  nccl::CommHandle comm = nullptr;
  char* send = nullptr;  // world segments of max_rows_per_peer rows, packed per peer
  char* receive = nullptr;
  int32_t* send_counts = nullptr;  // device [world]
  int32_t* recv_counts = nullptr;  // device [world]
  int32_t* host_counts = nullptr;  // pinned [world]
  uint64_t segment_bytes = 0;
};

bool NcclBaseline::available(std::string* why) { return nccl::load(why) != nullptr; }

std::string NcclBaseline::version() {
  std::string why;
  const nccl::Api* a = nccl::load(&why);
  return a ? a->version() : "not loaded: " + why;
}

std::string NcclBaseline::group_refusal(const Session& s) {
  const World& w = s.world();
  std::string why;
  const bool loads = available(&why);
  if (!w.all(loads)) return loads ? "NCCL does not load on every rank" : why;
  // NCCL allows one rank per GPU: find two ranks on one GPU of one host.
  const int64_t place = int64_t(std::hash<std::string>{}(w.host + "/" + s.gpu().pci_bus_id) >> 1);
  const std::vector<int64_t> places = w.allgather(place);
  for (int a = 0; a < w.size; ++a) {
    for (int b = a + 1; b < w.size; ++b) {
      if (places[a] == places[b]) {
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) +
               " share a GPU, and NCCL allows one rank per GPU";
      }
    }
  }
  return "";
}

NcclBaseline::NcclBaseline(const Session& s, int64_t max_rows_per_peer, uint64_t max_row_bytes)
    : state_(std::make_unique<State>()) {
  State& st = *state_;
  st.s = &s;
  const World& w = s.world();
  // NVLink multicast (NVLS) must stay off on the test machines; p2p never needs it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  nccl::UniqueId id{};
  if (w.is_root()) TOOL_CHECK_NCCL(api().GetUniqueId(&id));
  w.broadcast(&id, sizeof id, 0);
  TOOL_CHECK_NCCL(api().CommInitRank(&st.comm, w.size, id, w.rank));
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
  if (st.comm) api().CommDestroy(st.comm);
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
    TOOL_CHECK_NCCL(api().GroupStart());
    for (int p = 0; p < w.size; ++p) {
      TOOL_CHECK_NCCL(api().Send(st.send_counts + p, 1, nccl::kInt32, p, st.comm, stream));
      TOOL_CHECK_NCCL(api().Recv(st.recv_counts + p, 1, nccl::kInt32, p, st.comm, stream));
    }
    TOOL_CHECK_NCCL(api().GroupEnd());
    TOOL_CHECK_CUDA(cudaMemcpyAsync(st.host_counts, st.recv_counts, sizeof(int32_t) * w.size, cudaMemcpyDeviceToHost,
                                    stream));
    m.mark();
    TOOL_CHECK_CUDA(cudaStreamSynchronize(stream));
    m.hold();  // queue the payload behind a gate, so its time is not the host's launch time
    m.mark();
    TOOL_CHECK_NCCL(api().GroupStart());
    for (int p = 0; p < w.size; ++p) {
      TOOL_CHECK_NCCL(api().Send(st.send + p * st.segment_bytes, counts[p] * B, nccl::kInt8, p, st.comm, stream));
      TOOL_CHECK_NCCL(api().Recv(st.receive + p * st.segment_bytes, uint64_t(st.host_counts[p]) * B, nccl::kInt8, p,
                               st.comm, stream));
    }
    TOOL_CHECK_NCCL(api().GroupEnd());
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
    TOOL_CHECK_NCCL(api().GroupStart());
    for (int p = 0; p < w.size; ++p) {  // rows received from p go back to p
      TOOL_CHECK_NCCL(api().Send(st.receive + p * st.segment_bytes, t.rows_between(p, w.rank) * B, nccl::kInt8, p, st.comm,
                               stream));
      TOOL_CHECK_NCCL(api().Recv(st.send + p * st.segment_bytes, t.rows_between(w.rank, p) * B, nccl::kInt8, p, st.comm,
                               stream));
    }
    TOOL_CHECK_NCCL(api().GroupEnd());
    m.mark();
  });
}

}  // namespace moe_ep_tool
