// Which machine (and which boot of it) this process runs on, to decide whether
// all ranks can share memory through POSIX file descriptors.
#pragma once

#include <string>

namespace moe_ep {

struct HostIdentity {
  char hostname[64];
  char boot_id[48];  // /proc/sys/kernel/random/boot_id, "" where unreadable
};

HostIdentity local_host_identity();
bool same_host(const HostIdentity& a, const HostIdentity& b);
std::string describe_host(const HostIdentity& id);

}  // namespace moe_ep
