#include "machine_info.hpp"

#include <mpi.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <ctime>
#include <fstream>

#include "nccl_baseline.hpp"

namespace moe_ep_tool {

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return text;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string s(text, length);
  return s.substr(0, s.find_first_of("\n,"));
}

// One rank's line: "host|pid|device|pci|name|sms|memory".
std::string describe_rank(const Session& s) {
  const GpuInfo& g = s.gpu();
  return s.world().host + "|" + std::to_string(getpid()) + "|" + std::to_string(g.device) + "|" + g.pci_bus_id + "|" +
         (g.present ? g.name : "cpu") + "|" + std::to_string(g.sms) + "|" + std::to_string(g.memory_bytes);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t end; (end = s.find(sep, at)) != std::string::npos; at = end + 1) parts.push_back(s.substr(at, end - at));
  parts.push_back(s.substr(at));
  return parts;
}

}  // namespace

void write_machine(JsonWriter& json, const Session& s) {
  const std::vector<std::string> ranks = s.world().gather_text(describe_rank(s));
  if (!s.world().is_root()) return;
  utsname u{};
  uname(&u);
  json.key("machine").begin_object();
  json.field("date_utc", utc_now());
  json.field("moe_ep", Session::version_line());
  json.field("backend", s.backend_label());
  json.field("ranks", s.world().size);
  json.field("hosts_single", s.world().single_host());
  json.field("cpu", cpu_model());
  json.field("kernel", std::string(u.sysname) + " " + u.release);
  json.field("mpi", mpi_library());
  json.field("cuda_driver", s.gpu().driver_version);
  json.field("cuda_runtime", s.gpu().runtime_version);
  json.field("nccl", NcclBaseline::version());
  json.key("per_rank").begin_array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<std::string> f = split(ranks[r], '|');
    json.begin_object();
    json.field("rank", int(r)).field("host", f[0]).field("pid", int64_t(std::stoll(f[1]))).field("device", std::stoi(f[2]));
    json.field("pci_bus_id", f[3]).field("name", f[4]).field("sms", std::stoi(f[5]));
    json.field("memory_bytes", int64_t(std::stoll(f[6])));
    json.end_object();
  }
  json.end_array();
  json.end_object();
}

}  // namespace moe_ep_tool
