// What both subcommands share: the MPI world, the bootstrap, the GPU, the
// backend that was asked for and resolved, the stream, and the header lines
// that say where each rank runs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpu_info.hpp"
#include "memory.hpp"
#include "moe_ep_c.h"
#include "mpi_world.hpp"

namespace moe_ep_tool {

struct CommonOptions {
  std::string backend = "auto";  // host | nvlink | nccl | auto
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
  int32_t backend() const { return backend_; }  // MOE_EP_BACKEND_HOST, _NVLINK_TWO_SIDED or _NCCL
  std::string backend_label() const;             // "nvlink (auto)", "host", "nccl (network transport)", ...
  bool on_gpu() const { return backend_ != MOE_EP_BACKEND_HOST; }
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
  bool auto_resolved_ = false;
  std::string skip_reason_;
  Place place_;
  void* stream_ = nullptr;
};

}  // namespace moe_ep_tool
