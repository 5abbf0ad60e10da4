// The Open MPI bootstrap adapter (libmoe_ep_mpi) under mpiexec: both entry
// points, release, the messages for bad input (a struct size refused before
// any communicator is duplicated), and a HOST-backend case run through the
// adapter and checked against the oracle.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "host_case_runner.hpp"
#include "mpi_test_bootstrap.hpp"
#include "moe_ep_mpi.h"

using namespace moe_ep_test;

// MPI's profiling interface: this definition of MPI_Comm_dup is the one
// libmoe_ep_mpi binds to, so the tests can count the communicators it
// duplicates.
namespace {
int g_comm_dups = 0;
}  // namespace

extern "C" int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  ++g_comm_dups;
  return PMPI_Comm_dup(comm, newcomm);
}

namespace {

constexpr unsigned char kCanary = 0xA5;

// A bootstrap struct followed by canary bytes, all set to kCanary.
struct Guarded {
  unsigned char bytes[sizeof(moe_ep_bootstrap_t) + 64];
  Guarded() { std::memset(bytes, kCanary, sizeof bytes); }
  moe_ep_bootstrap_t* bootstrap() { return reinterpret_cast<moe_ep_bootstrap_t*>(bytes); }
  // The first offset in [from, to) that does not hold the canary; `to` if none.
  size_t first_changed(size_t from, size_t to) const {
    for (size_t i = from; i < to; ++i) {
      if (bytes[i] != kCanary) return i;
    }
    return to;
  }
};

// Calls one entry point: 0 the MPI_Comm* one, 1 the Fortran handle one.
moe_ep_status_t init_through(int entry, moe_ep_bootstrap_t* b, size_t struct_size) {
  if (entry == 0) {
    MPI_Comm world = MPI_COMM_WORLD;
    return moe_ep_mpi_bootstrap_init(&world, b, struct_size);
  }
  return moe_ep_mpi_bootstrap_init_fint(static_cast<int32_t>(MPI_Comm_c2f(MPI_COMM_WORLD)), b, struct_size);
}

}  // namespace

TEST_CASE("mpi adapter: Fortran handle entry point, release, and bad input", "[mpi][bootstrap]") {
  moe_ep_bootstrap_t b;
  const int32_t fint = static_cast<int32_t>(MPI_Comm_c2f(MPI_COMM_WORLD));
  REQUIRE(moe_ep_mpi_bootstrap_init_fint(fint, &b, sizeof b) == MOE_EP_SUCCESS);
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
  CHECK(moe_ep_mpi_bootstrap_init(nullptr, &b, sizeof b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "mpi_comm: expected a pointer to an MPI_Comm, got NULL");
  MPI_Comm null_comm = MPI_COMM_NULL;
  CHECK(moe_ep_mpi_bootstrap_init(&null_comm, &b, sizeof b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "mpi_comm: expected a valid communicator, got MPI_COMM_NULL");
  MPI_Comm world = MPI_COMM_WORLD;
  CHECK(moe_ep_mpi_bootstrap_init(&world, nullptr, sizeof b) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(moe_ep_last_error()) == "bootstrap: expected a non-NULL pointer, got NULL");
  REQUIRE(moe_ep_mpi_bootstrap_init(&world, &b, sizeof b) == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()).empty());
  CHECK(moe_ep_mpi_bootstrap_release(&b) == MOE_EP_SUCCESS);
}

TEST_CASE("mpi adapter: a struct size the core refuses fails before the communicator is duplicated",
          "[mpi][bootstrap][abi]") {
  const int entry = GENERATE(0, 1);
  const char* const function = entry == 0 ? "moe_ep_mpi_bootstrap_init" : "moe_ep_mpi_bootstrap_init_fint";
  INFO(function);
  // Too small (the first released layout is the whole struct), zero, cut
  // inside a field, not a multiple of the alignment, and above the largest
  // struct any header may have.
  const size_t bad = GENERATE(sizeof(moe_ep_bootstrap_t) - 8, size_t{16}, size_t{0}, size_t{4},
                              sizeof(moe_ep_bootstrap_t) + 4, size_t{4096});
  INFO("struct_size " << bad);
  Guarded g;
  const int dups = g_comm_dups;
  CHECK(init_through(entry, g.bootstrap(), bad) == MOE_EP_ERROR_INVALID_ARGUMENT);
  const std::string message = moe_ep_last_error();
  CHECK(message.rfind(std::string("struct_size of ") + function +
                          ": expected sizeof(moe_ep_bootstrap_t) of the caller's header: one of " +
                          std::to_string(sizeof(moe_ep_bootstrap_t)),
                      0) == 0);
  CHECK(message.find(", got " + std::to_string(bad)) != std::string::npos);
  CHECK(g_comm_dups == dups);                                            // nothing duplicated
  CHECK(g.first_changed(0, sizeof g.bytes) == sizeof g.bytes);           // nothing written
  CHECK(moe_ep_mpi_bootstrap_release(g.bootstrap()) == MOE_EP_SUCCESS);  // not ours: a no-op
}

TEST_CASE("mpi adapter: the caller's struct size is written and no byte past it", "[mpi][bootstrap][abi]") {
  const int entry = GENERATE(0, 1);
  INFO((entry == 0 ? "moe_ep_mpi_bootstrap_init" : "moe_ep_mpi_bootstrap_init_fint"));
  // This header's size, and a newer header's larger one.
  const size_t size = GENERATE(sizeof(moe_ep_bootstrap_t), sizeof(moe_ep_bootstrap_t) + 16);
  INFO("struct_size " << size);
  Guarded g;
  const int dups = g_comm_dups;
  REQUIRE(init_through(entry, g.bootstrap(), size) == MOE_EP_SUCCESS);
  CHECK(std::string(moe_ep_last_error()).empty());
  CHECK(g_comm_dups == dups + 1);
  moe_ep_bootstrap_t b;
  std::memcpy(&b, g.bytes, sizeof b);
  CHECK(b.struct_size == size);
  CHECK(b.rank == mpi_rank());
  CHECK(b.world_size == mpi_world_size());
  CHECK(b.ctx != nullptr);
  CHECK(b.allgather != nullptr);
  CHECK(b.barrier != nullptr);
  for (size_t i = sizeof(moe_ep_bootstrap_t); i < size; ++i) {
    INFO("byte " << i << " of a newer header's tail");
    CHECK(g.bytes[i] == 0);
  }
  CHECK(g.first_changed(size, sizeof g.bytes) == sizeof g.bytes);  // the canary past the size
  CHECK(b.barrier(b.ctx) == 0);
  REQUIRE(moe_ep_mpi_bootstrap_release(g.bootstrap()) == MOE_EP_SUCCESS);
}
