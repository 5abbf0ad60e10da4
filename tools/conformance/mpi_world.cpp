#include "mpi_world.hpp"

#include "errors.hpp"

namespace moe_ep_tool {

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

void World::barrier() const { TOOL_CHECK_MPI(MPI_Barrier(comm)); }

int64_t World::sum(int64_t value) const {
  int64_t out = 0;
  TOOL_CHECK_MPI(MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_SUM, comm));
  return out;
}

int64_t World::max(int64_t value) const {
  int64_t out = 0;
  TOOL_CHECK_MPI(MPI_Allreduce(&value, &out, 1, MPI_INT64_T, MPI_MAX, comm));
  return out;
}

bool World::all(bool value) const {
  int in = value ? 1 : 0, out = 0;
  TOOL_CHECK_MPI(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LAND, comm));
  return out != 0;
}

bool World::any(bool value) const {
  int in = value ? 1 : 0, out = 0;
  TOOL_CHECK_MPI(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, comm));
  return out != 0;
}

std::vector<double> World::allgather(double value) const {
  std::vector<double> out(size);
  TOOL_CHECK_MPI(MPI_Allgather(&value, 1, MPI_DOUBLE, out.data(), 1, MPI_DOUBLE, comm));
  return out;
}

std::vector<int64_t> World::allgather(int64_t value) const {
  std::vector<int64_t> out(size);
  TOOL_CHECK_MPI(MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, comm));
  return out;
}

std::vector<double> World::max_each(const std::vector<double>& values) const {
  std::vector<double> out(values.size());
  TOOL_CHECK_MPI(MPI_Allreduce(values.data(), out.data(), static_cast<int>(values.size()), MPI_DOUBLE,
                               MPI_MAX, comm));
  return out;
}

std::vector<std::string> World::gather_text(const std::string& text) const {
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(is_root() ? size : 0);
  TOOL_CHECK_MPI(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm));
  std::vector<int> offsets(lengths.size(), 0);
  int total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::vector<char> all(total + 1);
  TOOL_CHECK_MPI(MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                             MPI_CHAR, 0, comm));
  std::vector<std::string> out;
  for (size_t r = 0; r < lengths.size(); ++r) out.emplace_back(all.data() + offsets[r], lengths[r]);
  return out;
}

void World::broadcast(void* data, int bytes, int root) const {
  TOOL_CHECK_MPI(MPI_Bcast(data, bytes, MPI_BYTE, root, comm));
}

}  // namespace moe_ep_tool
