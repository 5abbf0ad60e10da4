#include "mpi_world.hpp"

#include <chrono>
#include <cstdio>
#include <thread>

#include "errors.hpp"

namespace moe_ep_tool {

void World::wait(MPI_Request* request, const char* call) const {
  using Clock = std::chrono::steady_clock;
  const int bound_ms = timeout_ms + kGraceMs;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bound_ms);
  for (int done = 0;;) {
    TOOL_CHECK_MPI(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (Clock::now() > deadline) {
      std::fprintf(stderr,
                   "moe_ep_conformance: rank %d: %s: the tool's %s did not complete within %d ms (--timeout-ms %d + "
                   "%d): a rank has died or stopped answering; aborting the job\n",
                   rank, phase_.c_str(), call, bound_ms, timeout_ms, kGraceMs);
      std::fflush(stderr);
      MPI_Abort(comm, kStalledExitCode);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

World World::from_comm(MPI_Comm comm) {
  World w;
  w.comm = comm;
  TOOL_CHECK_MPI(MPI_Comm_rank(comm, &w.rank));
  TOOL_CHECK_MPI(MPI_Comm_size(comm, &w.size));
  MPI_Comm local;
  TOOL_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local));
  TOOL_CHECK_MPI(MPI_Comm_rank(local, &w.local_rank));
  TOOL_CHECK_MPI(MPI_Comm_size(local, &w.local_size));
  TOOL_CHECK_MPI(MPI_Comm_free(&local));
  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  TOOL_CHECK_MPI(MPI_Get_processor_name(name, &length));
  w.host.assign(name, length);
  return w;
}

void World::barrier() const {
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Ibarrier(comm, &r));
  wait(&r, "MPI_Ibarrier");
}

int64_t World::sum(int64_t value) const {
  int64_t out = 0;
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, comm, &r));
  wait(&r, "MPI_Iallreduce");
  return out;
}

int64_t World::max(int64_t value) const {
  int64_t out = 0;
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, comm, &r));
  wait(&r, "MPI_Iallreduce");
  return out;
}

bool World::all(bool value) const {
  int in = value ? 1 : 0, out = 0;
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_LAND, comm, &r));
  wait(&r, "MPI_Iallreduce");
  return out != 0;
}

bool World::any(bool value) const {
  int in = value ? 1 : 0, out = 0;
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_LOR, comm, &r));
  wait(&r, "MPI_Iallreduce");
  return out != 0;
}

std::vector<double> World::allgather(double value) const {
  std::vector<double> out(size);
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, comm, &r));
  wait(&r, "MPI_Iallgather");
  return out;
}

std::vector<int64_t> World::allgather(int64_t value) const {
  std::vector<int64_t> out(size);
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Iallgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, comm, &r));
  wait(&r, "MPI_Iallgather");
  return out;
}

std::vector<double> World::max_each(const std::vector<double>& values) const {
  std::vector<double> out(values.size());
  MPI_Request r;
  TOOL_CHECK_MPI(
      MPI_Iallreduce(values.data(), out.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_MAX, comm, &r));
  wait(&r, "MPI_Iallreduce");
  return out;
}

std::vector<std::string> World::gather_text(const std::string& text) const {
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(is_root() ? size : 0);
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Igather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm, &r));
  wait(&r, "MPI_Igather");
  std::vector<int> offsets(lengths.size(), 0);
  int total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::vector<char> all(total + 1);
  TOOL_CHECK_MPI(
      MPI_Igatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0, comm, &r));
  wait(&r, "MPI_Igatherv");
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) out.emplace_back(all.data() + offsets[r], lengths[r]);
  return out;
}

void World::broadcast(void* data, int bytes, int root) const {
  MPI_Request r;
  TOOL_CHECK_MPI(MPI_Ibcast(data, bytes, MPI_BYTE, root, comm, &r));
  wait(&r, "MPI_Ibcast");
}

}  // namespace moe_ep_tool
