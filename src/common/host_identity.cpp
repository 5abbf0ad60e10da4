#include "common/host_identity.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace moe_ep {

HostIdentity local_host_identity() {
  HostIdentity id{};
  if (gethostname(id.hostname, sizeof(id.hostname) - 1) != 0) id.hostname[0] = '\0';
  id.hostname[sizeof(id.hostname) - 1] = '\0';
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    if (std::fgets(id.boot_id, sizeof(id.boot_id), f) == nullptr) id.boot_id[0] = '\0';
    std::fclose(f);
    id.boot_id[std::strcspn(id.boot_id, "\n")] = '\0';
  }
  return id;
}

bool same_host(const HostIdentity& a, const HostIdentity& b) {
  return std::strncmp(a.hostname, b.hostname, sizeof(a.hostname)) == 0 &&
         std::strncmp(a.boot_id, b.boot_id, sizeof(a.boot_id)) == 0;
}

std::string peer_text(const char* field, size_t capacity) {
  std::string text(field, strnlen(field, capacity));
  for (char& c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) c = '?';  // no terminal escapes, newlines or half-characters from a peer
  }
  return text;
}

std::string describe_host(const HostIdentity& id) {
  const std::string boot = peer_text(id.boot_id, sizeof(id.boot_id));
  return peer_text(id.hostname, sizeof(id.hostname)) + " (boot " + (boot.empty() ? "unknown" : boot) + ")";
}

}  // namespace moe_ep
