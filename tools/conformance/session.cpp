#include "session.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_check.hpp"

namespace moe_ep_tool {

namespace {
// The tool resolves AUTO itself (as the library would) so that it knows where
// to put the input tensors before the first call.
int32_t resolve_backend(const std::string& asked, const World& world, const GpuInfo& gpu, bool* resolved) {
  *resolved = false;
  if (asked == "host") return MOE_EP_BACKEND_HOST;
  if (asked == "nvlink") {
    if (!gpu.present) fail("--backend nvlink: rank " + std::to_string(world.rank) + " has no GPU (" + gpu.why_absent + ")");
    return MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  }
  if (asked == "nccl") {
    if (!gpu.present) fail("--backend nccl: rank " + std::to_string(world.rank) + " has no GPU (" + gpu.why_absent + ")");
    return MOE_EP_BACKEND_NCCL;
  }
  if (asked != "auto") fail("--backend must be host, nvlink, nccl or auto, got '" + asked + "'");
  int32_t supported = 0;
  if (gpu.present) TOOL_CHECK_MOE(moe_ep_is_platform_supported(gpu.device, &supported));
  *resolved = true;
  return world.all(supported != 0) ? MOE_EP_BACKEND_NVLINK_TWO_SIDED : MOE_EP_BACKEND_HOST;
}
}  // namespace

Session::Session(const World& world, const CommonOptions& options)
    : world_(world), options_(options), gpu_(select_gpu(world)) {
  MPI_Comm comm = world_.comm;
  TOOL_CHECK_MOE(moe_ep_mpi_bootstrap_init(&comm, &bootstrap_));
  backend_ = resolve_backend(options.backend, world_, gpu_, &auto_resolved_);
  if (on_gpu()) {
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
  moe_ep_params_t p;
  TOOL_CHECK_MOE(moe_ep_params_init(&p));
  p.num_experts = world_.size;
  p.top_k = 1;
  p.max_tokens_per_rank = 1;
  p.hidden_size = 8;
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
  std::string name = backend_ == MOE_EP_BACKEND_NVLINK_TWO_SIDED ? "nvlink"
                     : backend_ == MOE_EP_BACKEND_NCCL          ? "nccl"
                                                                : "host";
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
  TOOL_CHECK_MOE(moe_ep_config_init(&c));
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

}  // namespace moe_ep_tool
