// Catch2 main for the GPU tests under mpiexec.  Every rank checks for a CUDA
// device and the NVLink backend first, and, for the NCCL backend (which needs
// one GPU per rank), that this host has a GPU for each of its ranks; if any
// rank lacks what it needs, every rank prints why and exits 77 (CTest:
// skipped), so machines without enough GPUs skip cleanly.  Otherwise rank r
// uses device (local rank) % device count.  After the run, the exit code is 1
// if a case failed on any rank, else 77 if one was skipped (case_skip.hpp).
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "case_skip.hpp"
#include "gpu_case_runner.hpp"
#include "gpu_test_env.hpp"
#include "moe_ep_c.h"
#include "mpi_session.hpp"

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

// The ranks of this job on this host.
int ranks_on_this_host() {
  MPI_Comm host;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host);
  int n = 1;
  MPI_Comm_size(host, &n);
  MPI_Comm_free(&host);
  return n;
}

// "" if this rank can run the GPU tests, else why not.
std::string local_skip_reason(int rank, int host_ranks) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
  if (count == 0) return "no CUDA device";
#ifdef MOE_EP_TEST_ONE_GPU_PER_RANK
  const bool one_gpu_per_rank = true;
#else
  const bool one_gpu_per_rank = moe_ep_test::gpu_backend_under_test() == MOE_EP_BACKEND_NCCL;
#endif
  if (one_gpu_per_rank && count < host_ranks) {
    return "the NCCL backend needs one GPU per rank: " + std::to_string(host_ranks) + " ranks on this host, " +
           std::to_string(count) + " GPU" + (count == 1 ? "" : "s");
  }
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
  const std::string reason = local_skip_reason(rank, ranks_on_this_host());
  int ok = reason.empty() ? 1 : 0, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all_ok) {
    std::printf("rank %d: skipping the GPU tests: %s\n", rank, reason.empty() ? "another rank has no usable GPU" : reason.c_str());
    MPI_Finalize();
    return moe_ep_test::kSkipExitCode;
  }
  return moe_ep_test::run_session_on_every_rank(argc, argv);
}
