#include "mpi_test_bootstrap.hpp"

#ifdef MOE_EP_TEST_HAVE_MPI
#include <mpi.h>

#include "moe_ep_mpi.h"

#include <cstdlib>
#include <stdexcept>

namespace moe_ep_test {

int mpi_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int mpi_world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

const moe_ep_bootstrap_t& world_bootstrap() {
  static moe_ep_bootstrap_t b = [] {
    moe_ep_bootstrap_t x;
    MPI_Comm comm = MPI_COMM_WORLD;
    if (moe_ep_mpi_bootstrap_init(&comm, &x, sizeof x) != MOE_EP_SUCCESS) {
      throw std::runtime_error("moe_ep_mpi_bootstrap_init failed");
    }
    return x;
  }();
  return b;
}

std::vector<uint8_t> mpi_allgather_bytes(const void* data, size_t bytes) {
  std::vector<uint8_t> all(bytes * mpi_world_size());
  MPI_Allgather(data, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes), MPI_BYTE,
                MPI_COMM_WORLD);
  return all;
}

std::vector<std::vector<uint8_t>> mpi_allgatherv_bytes(const void* data, size_t bytes) {
  const int n = mpi_world_size();
  const long long mine = static_cast<long long>(bytes);
  std::vector<long long> sizes(n);
  MPI_Allgather(&mine, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD);
  std::vector<int> counts(n), displs(n);
  int at = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = static_cast<int>(sizes[r]);
    displs[r] = at;
    at += counts[r];
  }
  std::vector<uint8_t> flat(at);
  MPI_Allgatherv(data, static_cast<int>(bytes), MPI_BYTE, flat.data(), counts.data(), displs.data(),
                 MPI_BYTE, MPI_COMM_WORLD);
  std::vector<std::vector<uint8_t>> out(n);
  for (int r = 0; r < n; ++r) out[r].assign(flat.begin() + displs[r], flat.begin() + displs[r] + counts[r]);
  return out;
}

bool mpi_all(bool value) {
  int local = value ? 1 : 0, all = 0;
  MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all != 0;
}

}  // namespace moe_ep_test
#endif
