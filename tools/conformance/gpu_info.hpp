// Which GPU this rank uses (local rank modulo the visible devices) and what it
// is, without failing on a machine that has no GPU or no driver.
#pragma once

#include <string>

#include "mpi_world.hpp"

namespace moe_ep_tool {

struct GpuInfo {
  bool present = false;  // a usable CUDA device was selected
  int device = -1;
  int visible = 0;       // devices this process sees
  std::string name, pci_bus_id, why_absent;
  int sms = 0;
  unsigned long long memory_bytes = 0;
  int driver_version = 0, runtime_version = 0;
};

// Selects (cudaSetDevice) device local_rank % visible when there is one.
GpuInfo select_gpu(const World& world);

}  // namespace moe_ep_tool
