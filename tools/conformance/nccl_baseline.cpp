#include "nccl_baseline.hpp"

#include <cuda_runtime.h>  // the typed cudaMalloc overloads
#include <dlfcn.h>

#include <cstdlib>
#include <functional>
#include <mutex>

#include "errors.hpp"

namespace moe_ep_tool {

namespace {

// The tool's own NCCL, loaded at run time like the library's (the same
// library: MOE_EP_NCCL_LIBRARY, else libnccl.so.2 on the loader's search
// path), with only the entry points the baseline calls and NCCL's C types as
// NCCL 2.x lays them out, so that the tool needs neither nccl.h nor libnccl to
// build.
namespace nccl {

using Result = int;  // ncclResult_t
constexpr Result kSuccess = 0;
constexpr Result kInProgress = 7;
using DataType = int;  // ncclDataType_t
constexpr DataType kInt8 = 0;
constexpr DataType kInt32 = 2;
struct Comm;
using CommHandle = Comm*;
struct UniqueId {
  char internal[128];
};

struct Api {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* id);
  Result (*CommInitRank)(CommHandle* comm, int nranks, UniqueId id, int rank);
  Result (*CommDestroy)(CommHandle comm);
  Result (*Send)(const void* buffer, size_t count, DataType type, int peer, CommHandle comm, cudaStream_t stream);
  Result (*Recv)(void* buffer, size_t count, DataType type, int peer, CommHandle comm, cudaStream_t stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  const char* (*GetErrorString)(Result result);
  int version_code = 0;  // X*10000 + Y*100 + Z
};

std::string library_name() {
  const char* v = std::getenv("MOE_EP_NCCL_LIBRARY");
  return v != nullptr && *v != '\0' ? v : "libnccl.so.2";
}

template <typename Fn>
void resolve(void* library, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(symbol);
}

// Loaded once per process; a failure is kept with its reason.
const Api* load(std::string* why) {
  static std::once_flag once;
  static Api api;
  static const Api* loaded = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    const std::string name = library_name();
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* e = dlerror();
      failure = "dlopen(\"" + name + "\") failed: " + (e ? e : "unknown error") +
                " (install NCCL and put it on LD_LIBRARY_PATH, or set MOE_EP_NCCL_LIBRARY to libnccl.so.2's path)";
      return;
    }
    std::string missing;
    resolve(library, "ncclGetVersion", &api.GetVersion, &missing);
    resolve(library, "ncclGetUniqueId", &api.GetUniqueId, &missing);
    resolve(library, "ncclCommInitRank", &api.CommInitRank, &missing);
    resolve(library, "ncclCommDestroy", &api.CommDestroy, &missing);
    resolve(library, "ncclSend", &api.Send, &missing);
    resolve(library, "ncclRecv", &api.Recv, &missing);
    resolve(library, "ncclGroupStart", &api.GroupStart, &missing);
    resolve(library, "ncclGroupEnd", &api.GroupEnd, &missing);
    resolve(library, "ncclGetErrorString", &api.GetErrorString, &missing);
    if (!missing.empty()) {
      failure = "NCCL at \"" + name + "\" lacks " + missing;
    } else if (api.GetVersion(&api.version_code) != kSuccess) {
      failure = "ncclGetVersion failed for \"" + name + "\"";
    } else {
      loaded = &api;  // the library stays loaded for the life of the process
      return;
    }
    dlclose(library);
  });
  if (loaded == nullptr && why != nullptr) *why = failure;
  return loaded;
}

}  // namespace nccl

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
  if (a == nullptr) return "not loaded: " + why;
  const int v = a->version_code;
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
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
