// TCP plumbing for the store: a socket that closes itself, and reads, writes,
// connects and accepts that each end by a deadline.  No call here blocks past
// its deadline; a peer that closes or stalls is an Error (BOOTSTRAP for a
// broken connection, TIMEOUT for a missed deadline) naming `what`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace moe_ep::store {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after_ms(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close() noexcept;
  // Wakes a thread blocked in poll on this socket (shutdown(2)), keeps the fd.
  void shutdown() noexcept;

 private:
  int fd_ = -1;
};

// "host:port" (host may be a name, an IPv4 address, or [IPv6]).
struct Address {
  std::string host;
  int32_t port = 0;
};
// INVALID_ARGUMENT naming `argument` when the text is not host:port with a port in 1..65535.
Address parse_address(const std::string& text, const std::string& argument);

// Exactly n bytes, or an Error: TIMEOUT at the deadline, BOOTSTRAP when the peer closed.
void read_exact(const Socket& s, void* data, size_t n, Deadline deadline, const std::string& what);
void write_exact(const Socket& s, const void* data, size_t n, Deadline deadline, const std::string& what);
// Waits until the socket is readable: true, or false at the deadline.
bool wait_readable(const Socket& s, Deadline deadline);

Socket connect_to(const Address& address, Deadline deadline, const std::string& what);
// A listening socket on host:port (port 0: the kernel picks one); *bound_port gets the port.
Socket listen_on(const std::string& host, int32_t port, int32_t* bound_port);
// An accepted connection, or an invalid Socket when none arrived by the deadline.
Socket accept_until(const Socket& listener, Deadline deadline);

}  // namespace moe_ep::store
