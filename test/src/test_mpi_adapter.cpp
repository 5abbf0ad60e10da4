// The Open MPI bootstrap adapter (libmoe_ep_mpi) under mpiexec: both entry
// points, release, the messages for bad input, and a HOST-backend case run
// through the adapter and checked against the oracle.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <string>

#include "host_case_runner.hpp"
#include "mpi_test_bootstrap.hpp"
#include "moe_ep_mpi.h"

using namespace moe_ep_test;

TEST_CASE("mpi adapter: Fortran handle entry point, release, and bad input", "[mpi][bootstrap]") {
  moe_ep_bootstrap_t b;
  const int32_t fint = static_cast<int32_t>(MPI_Comm_c2f(MPI_COMM_WORLD));
  REQUIRE(moe_ep_mpi_bootstrap_init_fint(fint, &b) == MOE_EP_SUCCESS);
  CHECK(b.rank == mpi_rank());
  CHECK(b.world_size == mpi_world_size());
  WorkloadSpec s;
  s.world = mpi_world_size();
  s.num_experts = 3 * s.world;
  s.top_k = 2;
  s.max_tokens_per_rank = 5;
  s.hidden_size = 6;
  s.seed = 4242;
  const std::string problem = run_host_case(s, b, 2).problems;
  INFO(problem);
  CHECK(problem.empty());
  REQUIRE(moe_ep_mpi_bootstrap_release(&b) == MOE_EP_SUCCESS);
  CHECK(b.ctx == nullptr);
  CHECK(b.allgather == nullptr);
  CHECK(moe_ep_mpi_bootstrap_release(&b) == MOE_EP_SUCCESS);  // twice is fine
  CHECK(moe_ep_mpi_bootstrap_release(nullptr) == MOE_EP_SUCCESS);
  CHECK(moe_ep_mpi_bootstrap_init(nullptr, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "mpi_comm: expected a pointer to an MPI_Comm, got NULL");
  MPI_Comm null_comm = MPI_COMM_NULL;
  CHECK(moe_ep_mpi_bootstrap_init(&null_comm, &b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "mpi_comm: expected a valid communicator, got MPI_COMM_NULL");
  MPI_Comm world = MPI_COMM_WORLD;
  CHECK(moe_ep_mpi_bootstrap_init(&world, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "bootstrap: expected a non-NULL pointer, got NULL");
  REQUIRE(moe_ep_mpi_bootstrap_init(&world, &b) == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()).empty());
  CHECK(moe_ep_mpi_bootstrap_release(&b) == MOE_EP_SUCCESS);
}
