// Bootstrap and small helpers for tests that run under mpiexec.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep_test {

int mpi_rank();
int mpi_world_size();

// A bootstrap over MPI_COMM_WORLD through libmoe_ep_mpi; released at exit.
const moe_ep_bootstrap_t& world_bootstrap();

// Gathers a vector of the same length from every rank (rank-major result).
std::vector<uint8_t> mpi_allgather_bytes(const void* data, size_t bytes);
// Gathers vectors of different lengths (counts allgathered first).
std::vector<std::vector<uint8_t>> mpi_allgatherv_bytes(const void* data, size_t bytes);

// Logical AND of a condition over all ranks.
bool mpi_all(bool value);

}  // namespace moe_ep_test
