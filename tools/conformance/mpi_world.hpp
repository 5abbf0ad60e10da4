// The MPI job as the tool sees it: ranks, the ranks of this host, and the few
// collectives the tool needs (sums, agreement, gathering text to rank 0).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace moe_ep_tool {

struct World {
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this host
  int local_size = 1;
  std::string host;

  bool is_root() const { return rank == 0; }
  bool single_host() const { return local_size == size; }

  static World from_comm(MPI_Comm comm);

  void barrier() const;
  int64_t sum(int64_t value) const;
  int64_t max(int64_t value) const;
  bool all(bool value) const;   // logical AND over ranks
  bool any(bool value) const;   // logical OR over ranks
  // Every rank's value, on every rank.
  std::vector<double> allgather(double value) const;
  std::vector<int64_t> allgather(int64_t value) const;
  // Element-wise max over ranks of equally long vectors.
  std::vector<double> max_each(const std::vector<double>& values) const;
  // Rank 0 gets every rank's text (others get an empty vector).
  std::vector<std::string> gather_text(const std::string& text) const;
  void broadcast(void* data, int bytes, int root) const;
};

}  // namespace moe_ep_tool
