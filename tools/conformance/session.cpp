#include "session.hpp"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>

#include "errors.hpp"
#include "moe_ep_mpi.h"
#include "nccl_baseline.hpp"

namespace moe_ep_tool {

GpuInfo select_gpu(const World& world) {
  GpuInfo g;
  cudaRuntimeGetVersion(&g.runtime_version);
  cudaDriverGetVersion(&g.driver_version);  // 0 without a driver
  const cudaError_t rc = cudaGetDeviceCount(&g.visible);
  if (rc != cudaSuccess || g.visible == 0) {
    // No driver or no device is a normal state for this tool: the HOST backend.
    // cudaDriverGetVersion gives 0 where no driver is installed, where the runtime
    // still says "CUDA driver version is insufficient".
    g.why_absent = rc == cudaSuccess ? "no CUDA device visible"
                   : g.driver_version == 0 ? "no CUDA driver found (libcuda.so.1 is not installed)"
                                           : cudaGetErrorString(rc);
    g.visible = 0;
    cudaGetLastError();
    return g;
  }
  g.device = world.local_rank % g.visible;
  TOOL_CHECK_CUDA(cudaSetDevice(g.device));
  cudaDeviceProp prop{};
  TOOL_CHECK_CUDA(cudaGetDeviceProperties(&prop, g.device));
  g.name = prop.name;
  g.sms = prop.multiProcessorCount;
  g.memory_bytes = prop.totalGlobalMem;
  char bus[32] = {};
  TOOL_CHECK_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, g.device));
  g.pci_bus_id = bus;
  g.present = true;
  return g;
}

namespace {

// The backends --backend can name.  A new backend is one row here; `auto`
// takes what the library's AUTO chooses for this group.
struct BackendChoice {
  const char* name;
  int32_t id;
  bool on_gpu;       // tensors in device memory, a stream, CUDA-event timing
  LinkWording link;  // what carries the rows between ranks, in the bench's words
};
const BackendChoice kBackends[] = {
    {"host", MOE_EP_BACKEND_HOST, false, {"peer", "move between ranks"}},
    {"nvlink", MOE_EP_BACKEND_NVLINK_TWO_SIDED, true, {"nvl", "cross NVLink"}},
    {"nccl", MOE_EP_BACKEND_NCCL, true, {"net", "NCCL moves between ranks"}},
};

// Parameters of the smallest handle, for asking the library a collective
// question (which backend AUTO takes; whether NCCL accepts this group).
moe_ep_params_t probe_params(int world_size) {
  moe_ep_params_t p;
  TOOL_CHECK_MOE(moe_ep_params_init(&p, sizeof p));
  p.num_experts = world_size;
  p.top_k = 1;
  p.max_tokens_per_rank = 1;
  p.hidden_size = 8;
  return p;
}

// The library's AUTO for this group (agreed over every rank, NCCL included),
// read from a probe handle before the first call, so that the tool knows where
// to put the input tensors and runs where an application's AUTO would.
int32_t library_auto_choice(const moe_ep_bootstrap_t& bootstrap, const World& world, const GpuInfo& gpu,
                            int timeout_ms) {
  const moe_ep_params_t p = probe_params(world.size);
  moe_ep_config_t c;
  TOOL_CHECK_MOE(moe_ep_config_init(&c, sizeof c));
  c.backend = MOE_EP_BACKEND_AUTO;
  c.timeout_ms = timeout_ms;
  c.device = gpu.present ? gpu.device : -1;
  moe_ep_handle_t h = nullptr;
  TOOL_CHECK_MOE(moe_ep_create(&bootstrap, &p, &c, &h));
  int32_t backend = MOE_EP_BACKEND_HOST;
  const moe_ep_status_t s = moe_ep_get_backend(h, &backend);
  TOOL_CHECK_MOE(moe_ep_destroy(&h));
  TOOL_CHECK_MOE(s);
  return backend;
}

const BackendChoice& resolve_backend(const std::string& asked, const World& world, const GpuInfo& gpu,
                                     const moe_ep_bootstrap_t& bootstrap, int timeout_ms, bool* resolved) {
  *resolved = asked == "auto";
  if (*resolved) {
    const int32_t id = library_auto_choice(bootstrap, world, gpu, timeout_ms);
    for (const BackendChoice& b : kBackends) {
      if (b.id == id) return b;
    }
    fail("--backend auto: the library chose backend " + std::to_string(id) + ", which the tool does not know");
  }
  for (const BackendChoice& b : kBackends) {
    if (asked != b.name) continue;
    if (b.on_gpu && !gpu.present) {
      fail("--backend " + asked + ": rank " + std::to_string(world.rank) + " has no GPU (" + gpu.why_absent + ")");
    }
    return b;
  }
  std::string names;
  for (const std::string& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
  fail("--backend must be one of " + names + ", got '" + asked + "'");
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendChoice& b : kBackends) names.push_back(b.name);
  names.push_back("auto");
  return names;
}

Session::Session(const World& world, const CommonOptions& options)
    : world_(world), options_(options), gpu_(select_gpu(world)) {
  MPI_Comm comm = world_.comm;
  TOOL_CHECK_MOE(moe_ep_mpi_bootstrap_init(&comm, &bootstrap_, sizeof bootstrap_));
  const BackendChoice& chosen =
      resolve_backend(options.backend, world_, gpu_, bootstrap_, options.timeout_ms, &auto_resolved_);
  backend_ = chosen.id;
  backend_name_ = chosen.name;
  on_gpu_ = chosen.on_gpu;
  link_ = chosen.link;
  if (on_gpu_) {
    place_ = Place{true, gpu_.device};
    cudaStream_t s = nullptr;
    TOOL_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    stream_ = s;
  }
  if (backend_ == MOE_EP_BACKEND_NCCL) skip_reason_ = probe_refusal();
}

// Creates and destroys one small handle: UNSUPPORTED (NCCL refusing this
// group, e.g. two ranks on one GPU) becomes the reason to skip; any other
// failure is an error.
std::string Session::probe_refusal() const {
  const moe_ep_params_t p = probe_params(world_.size);
  const moe_ep_config_t c = config();
  moe_ep_handle_t h = nullptr;
  const moe_ep_status_t s = moe_ep_create(&bootstrap_, &p, &c, &h);
  if (s == MOE_EP_ERROR_UNSUPPORTED) return std::string("backend nccl refuses this group: ") + moe_ep_last_error();
  TOOL_CHECK_MOE(s);
  TOOL_CHECK_MOE(moe_ep_destroy(&h));
  return "";
}

Session::~Session() {
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  moe_ep_mpi_bootstrap_release(&bootstrap_);
}

std::string Session::backend_label() const {
  std::string name = backend_name_;
  if (backend_ == MOE_EP_BACKEND_NCCL) {  // which NCCL transport the environment leaves it
    const char* p2p = std::getenv("NCCL_P2P_DISABLE");
    const char* shm = std::getenv("NCCL_SHM_DISABLE");
    const bool network = p2p && shm && std::string(p2p) == "1" && std::string(shm) == "1";
    name += network ? " (network transport: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1)" : " (NCCL's default transports)";
  }
  return auto_resolved_ ? name + " (auto)" : name;
}

moe_ep_config_t Session::config() const {
  moe_ep_config_t c;
  TOOL_CHECK_MOE(moe_ep_config_init(&c, sizeof c));
  c.backend = backend_;
  c.num_sms = options_.num_sms;
  c.timeout_ms = options_.timeout_ms;
  c.device = on_gpu() ? gpu_.device : -1;
  return c;
}

std::vector<std::string> Session::rank_lines() const {
  char line[512];
  if (gpu_.present) {
    std::snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s device %2d [%s] %s, %d SMs, %.0f GiB", world_.rank,
                  int(getpid()), world_.host.c_str(), gpu_.device, gpu_.pci_bus_id.c_str(), gpu_.name.c_str(),
                  gpu_.sms, double(gpu_.memory_bytes) / (1ull << 30));
  } else {
    std::snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s cpu (no GPU: %s)", world_.rank, int(getpid()),
                  world_.host.c_str(), gpu_.why_absent.c_str());
  }
  return world_.gather_text(line);
}

std::string Session::version_line() {
  int32_t major = 0, minor = 0, patch = 0;
  moe_ep_get_version(&major, &minor, &patch);
  char line[128];
  std::snprintf(line, sizeof line, "moe_ep %d.%d.%d (header %d.%d.%d)", major, minor, patch, MOE_EP_VERSION_MAJOR,
                MOE_EP_VERSION_MINOR, MOE_EP_VERSION_PATCH);
  return line;
}

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, length);
  return s.substr(0, s.find_first_of("\n,"));
}

// One rank's line: "host|pid|device|pci|name|sms|memory".
std::string describe_rank(const Session& s) {
  const GpuInfo& g = s.gpu();
  return s.world().host + "|" + std::to_string(getpid()) + "|" + std::to_string(g.device) + "|" + g.pci_bus_id + "|" +
         (g.present ? g.name : "cpu") + "|" + std::to_string(g.sms) + "|" + std::to_string(g.memory_bytes);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t end; (end = s.find(sep, at)) != std::string::npos; at = end + 1) parts.push_back(s.substr(at, end - at));
  parts.push_back(s.substr(at));
  return parts;
}

}  // namespace

void write_machine(JsonWriter& json, const Session& s) {
  const std::vector<std::string> ranks = s.world().gather_text(describe_rank(s));
  if (!s.world().is_root()) return;
  utsname u{};
  uname(&u);
  json.key("machine").begin_object();
  json.field("date_utc", utc_now());
  json.field("moe_ep", Session::version_line());
  json.field("backend", s.backend_label());
  json.field("ranks", s.world().size);
  json.field("hosts_single", s.world().single_host());
  json.field("cpu", cpu_model());
  json.field("kernel", std::string(u.sysname) + " " + u.release);
  json.field("mpi", mpi_library());
  json.field("cuda_driver", s.gpu().driver_version);
  json.field("cuda_runtime", s.gpu().runtime_version);
  json.field("nccl", NcclBaseline::version());
  json.key("per_rank").begin_array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<std::string> f = split(ranks[r], '|');
    json.begin_object();
    json.field("rank", int(r))
        .field("host", f[0])
        .field("pid", int64_t(std::stoll(f[1])))
        .field("device", std::stoi(f[2]));
    json.field("pci_bus_id", f[3]).field("name", f[4]).field("sms", std::stoi(f[5]));
    json.field("memory_bytes", int64_t(std::stoll(f[6])));
    json.end_object();
  }
  json.end_array();
  json.end_object();
}

}  // namespace moe_ep_tool
