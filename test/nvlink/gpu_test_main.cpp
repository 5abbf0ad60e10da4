// Catch2 main for the GPU tests under mpiexec.  Every rank checks for a CUDA
// device and the NVLink backend first; if any rank has none, every rank
// prints why and exits 77 (CTest: skipped), so CI machines without a GPU skip
// cleanly.  Otherwise rank r uses device (local rank) % device count.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpu_test_env.hpp"
#include "moe_ep_c.h"

namespace moe_ep_test {
namespace {
int g_device = 0;
int g_device_count = 0;
}  // namespace
int gpu_device() { return g_device; }
int gpu_device_count() { return g_device_count; }
}  // namespace moe_ep_test

namespace {

int local_rank(int world_rank) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return world_rank;
}

// "" if this rank can run the GPU tests, else why not.
std::string local_skip_reason(int rank) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  if (count == 0) return "no CUDA device";
  moe_ep_test::g_device_count = count;
  moe_ep_test::g_device = local_rank(rank) % count;
  if (cudaSetDevice(moe_ep_test::g_device) != cudaSuccess) return "cudaSetDevice failed";
  int32_t supported = 0;
  if (moe_ep_is_platform_supported(moe_ep_test::g_device, &supported) != MOE_EP_SUCCESS || !supported) {
    return "moe_ep_is_platform_supported(" + std::to_string(moe_ep_test::g_device) + ") = 0";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::string reason = local_skip_reason(rank);
  int ok = reason.empty() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    std::printf("rank %d: skipping the GPU tests: %s\n", rank, reason.empty() ? "another rank has no usable GPU" : reason.c_str());
    MPI_Finalize();
    return 77;
  }
  const int failed = Catch::Session().run(argc, argv);
  int local = failed != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
