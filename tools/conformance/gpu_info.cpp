#include "gpu_info.hpp"

#include <cuda_runtime_api.h>

#include "cuda_check.hpp"

namespace moe_ep_tool {

GpuInfo select_gpu(const World& world) {
  GpuInfo g;
  cudaRuntimeGetVersion(&g.runtime_version);
  cudaDriverGetVersion(&g.driver_version);  // 0 without a driver
  const cudaError_t rc = cudaGetDeviceCount(&g.visible);
  if (rc != cudaSuccess || g.visible == 0) {
    // No driver or no device is a normal state for this tool: the HOST backend.
    g.why_absent = rc != cudaSuccess ? cudaGetErrorString(rc) : "no CUDA device visible";
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

}  // namespace moe_ep_tool
