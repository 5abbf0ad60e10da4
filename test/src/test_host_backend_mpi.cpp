// The HOST backend over MPI_COMM_WORLD (run with 1, 2, 3 and 4 ranks), with
// randomized cases checked against the independent brute-force model.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <string>

#include "host_case_runner.hpp"
#include "mpi_test_bootstrap.hpp"
#include "random_inputs.hpp"

using namespace moe_ep_test;

namespace {

void run_and_check(const CaseSpec& spec) {
  const std::string problem = check_case(spec, mpi_rank(), run_host_case(spec, world_bootstrap()));
  INFO(spec.describe() << "\nrank " << mpi_rank() << ":\n" << problem);
  CHECK(problem.empty());
  CHECK(mpi_all(problem.empty()));  // every rank agrees the case passed
}

}  // namespace

TEST_CASE("mpi host backend: randomized cases", "[mpi][host]") {
  const int world = mpi_world_size();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    CaseSpec s;
    s.world_size = world;
    s.num_experts = world * static_cast<int>(1 + seed % 3);
    s.top_k = static_cast<int>(1 + seed % s.num_experts);
    s.max_tokens_per_rank = static_cast<int>(5 + seed);
    s.hidden_size = static_cast<int>(7 * seed);
    s.mask_fraction = 0.15 * static_cast<double>(seed % 3);
    s.with_weights = seed % 2 == 0;
    s.eplb_stats = seed % 3 == 0;
    s.scale_row_elems = static_cast<int>(seed % 2);
    s.combine_dtype = seed % 3 == 0 ? moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 32, 1}
                                    : (seed % 3 == 1 ? moe_ep_dtype_t{MOE_EP_DTYPE_BFLOAT, 16, 1}
                                                     : moe_ep_dtype_t{MOE_EP_DTYPE_FLOAT, 16, 1});
    s.runtime_max_tokens_per_rank = seed == 4 ? 3 : 0;
    s.seed = seed * 7919;
    run_and_check(s);
  }
}

TEST_CASE("mpi host backend: rank 0 has no tokens, the last rank is full", "[mpi][host]") {
  CaseSpec s;
  s.world_size = mpi_world_size();
  s.num_experts = 2 * s.world_size;
  s.top_k = 2;
  s.max_tokens_per_rank = 6;
  s.hidden_size = 10;
  s.tokens.assign(s.world_size, 3);
  s.tokens[0] = 0;
  s.tokens[s.world_size - 1] = 6;
  s.seed = 99;
  run_and_check(s);
}

TEST_CASE("mpi adapter: Fortran handle entry point, release, and bad input", "[mpi][bootstrap]") {
  moe_ep_bootstrap_t b;
  const int32_t fint = static_cast<int32_t>(MPI_Comm_c2f(MPI_COMM_WORLD));
  REQUIRE(moe_ep_mpi_bootstrap_init_fint(fint, &b) == MOE_EP_SUCCESS);
  CHECK(b.rank == mpi_rank());
  CHECK(b.world_size == mpi_world_size());
  CaseSpec s;
  s.world_size = mpi_world_size();
  s.num_experts = 3 * s.world_size;
  s.top_k = 2;
  s.max_tokens_per_rank = 5;
  s.hidden_size = 6;
  s.seed = 4242;
  const std::string problem = check_case(s, mpi_rank(), run_host_case(s, b));
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
