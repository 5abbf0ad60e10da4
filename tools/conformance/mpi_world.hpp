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
  // The tool's own collectives give up timeout_ms + kGraceMs after they start
  // (a rank that died or stopped would leave the others waiting for ever):
  // the job is aborted with a message naming the phase.
  int timeout_ms = 30000;
  static constexpr int kGraceMs = 5000;
  static constexpr int kStalledExitCode = 4;

  bool is_root() const { return rank == 0; }
  // What the tool is doing, for that message.
  void set_phase(const std::string& phase) const { phase_ = phase; }
  const std::string& phase() const { return phase_; }
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

 private:
  // Waits for a non-blocking collective, at most timeout_ms + kGraceMs.
  void wait(MPI_Request* request, const char* call) const;
  mutable std::string phase_ = "start-up";
};

}  // namespace moe_ep_tool
