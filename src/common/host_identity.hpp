// Which machine (and which boot of it) this process runs on, to decide whether
// all ranks can share memory through POSIX file descriptors.
#pragma once

#include <cstddef>
#include <string>

namespace moe_ep {

struct HostIdentity {
  char hostname[64];
  char boot_id[48];  // /proc/sys/kernel/random/boot_id, "" where unreadable
};

HostIdentity local_host_identity();
bool same_host(const HostIdentity& a, const HostIdentity& b);
// Bounded and printable: reads at most the fields' sizes (a peer's record
// need not hold a NUL), with control characters replaced by '?'.
std::string describe_host(const HostIdentity& id);

// Text that came from a peer (a fixed field of a bootstrap record): at most
// `capacity` bytes, up to the first NUL, every byte outside printable ASCII
// replaced by '?', so that it can go into this rank's messages as it is.
std::string peer_text(const char* field, size_t capacity);

}  // namespace moe_ep
