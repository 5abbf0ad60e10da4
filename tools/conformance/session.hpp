// What both subcommands share: the MPI world, the bootstrap, the GPU, the
// backend that was asked for and resolved, the stream, and the description of
// the machine (header lines that say where each rank runs, and the JSON).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_writer.hpp"
#include "memory.hpp"
#include "moe_ep_c.h"
#include "mpi_world.hpp"

namespace moe_ep_tool {

// Which GPU this rank uses (local rank modulo the visible devices) and what it
// is, without failing on a machine that has no GPU or no driver.
struct GpuInfo {
  bool present = false;  // a usable CUDA device was selected
  int device = -1;
  int visible = 0;  // devices this process sees
  std::string name, pci_bus_id, why_absent;
  int sms = 0;
  unsigned long long memory_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Selects (cudaSetDevice) device local_rank % visible when there is one.
GpuInfo select_gpu(const World& world);

// How the benchmark names the bytes that leave a rank, per backend:
// column "<short_name>_bytes", "bytes that <crossing>".
struct LinkWording {
  const char* short_name;  // "nvl", "peer"
  const char* crossing;    // "cross NVLink", "move between ranks"
};

// The names --backend accepts: every backend the tool knows, then "auto".
std::vector<std::string> backend_names();

struct CommonOptions {
  std::string backend = "auto";  // one of backend_names()
  int num_sms = 0;
  int timeout_ms = 30000;
  uint64_t seed = 1;
};

class Session {
 public:
  Session(const World& world, const CommonOptions& options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const World& world() const { return world_; }
  const GpuInfo& gpu() const { return gpu_; }
  const moe_ep_bootstrap_t& bootstrap() const { return bootstrap_; }
  int32_t backend() const { return backend_; }                       // MOE_EP_BACKEND_*
  const std::string& backend_name() const { return backend_name_; }  // "host", "nvlink", ...
  std::string backend_label() const;             // "nvlink (auto)", "host", "nccl (network transport: ...)"
  bool on_gpu() const { return on_gpu_; }        // tensors in device memory, CUDA timing
  const LinkWording& link() const { return link_; }
  // Why this run cannot use the backend it asked for ("" = it can): a backend
  // that refuses this group (NCCL with two ranks on one GPU).  Collective.
  const std::string& skip_reason() const { return skip_reason_; }
  const Place& place() const { return place_; }
  void* stream() const { return stream_; }       // NULL on the host backend
  moe_ep_config_t config() const;
  const CommonOptions& options() const { return options_; }

  // "#  Rank  0 Pid 123 on host device 0 [0000:19:00.0] NVIDIA H200, 132 SMs"
  // for every rank; on rank 0 only (collective).
  std::vector<std::string> rank_lines() const;
  // "moe_ep 0.1.0 (header 0.1.0)".
  static std::string version_line();

 private:
  std::string probe_refusal() const;

  World world_;
  CommonOptions options_;
  GpuInfo gpu_;
  moe_ep_bootstrap_t bootstrap_{};
  int32_t backend_ = MOE_EP_BACKEND_HOST;
  std::string backend_name_ = "host";
  bool on_gpu_ = false;
  LinkWording link_{"peer", "move between ranks"};
  bool auto_resolved_ = false;
  std::string skip_reason_;
  Place place_;
  void* stream_ = nullptr;
};

// The machine and the software, for the benchmark's JSON: enough to tell two
// runs apart (GPUs, driver, runtime, NCCL, MPI, CPU, host).  Collective (every
// rank describes itself); rank 0 writes the "machine" object.
void write_machine(JsonWriter& json, const Session& session);

}  // namespace moe_ep_tool
