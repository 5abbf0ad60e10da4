#include "store/socket_io.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "error.hpp"

namespace moe_ep::store {

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() noexcept {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Address parse_address(const std::string& text, const std::string& argument) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) {
    fail_argument(argument, "\"host:port\"", "\"" + text + "\"");
  }
  Address a;
  a.host = text.substr(0, colon);
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  const std::string port = text.substr(colon + 1);
  int64_t value = 0;
  for (char c : port) {
    if (c < '0' || c > '9' || value > 65535)
      fail_argument(argument, "a port in 1..65535 after ':'", "\"" + text + "\"");
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > 65535) fail_argument(argument, "a port in 1..65535 after ':'", "\"" + text + "\"");
  a.port = static_cast<int32_t>(value);
  return a;
}

namespace {

int remaining_ms(Deadline deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000 * 1000 ? 1000 * 1000 : static_cast<int>(left);
}

// Polls for `events` until the deadline: true when ready (or the socket
// failed, which the next read or write reports), false at the deadline.
bool wait_for(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;
  }
}

[[noreturn]] void fail_io(const std::string& what, const char* op) {
  fail(MOE_EP_ERROR_BOOTSTRAP, what, ": ", op, " failed: ", std::strerror(errno));
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) fail_io("store socket", "fcntl(O_NONBLOCK)");
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // latency only: failure is harmless
}

}  // namespace

bool wait_readable(const Socket& s, Deadline deadline) { return wait_for(s.fd(), POLLIN, deadline); }

void read_exact(const Socket& s, void* data, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    if (!wait_for(s.fd(), POLLIN, deadline)) {
      fail(MOE_EP_ERROR_TIMEOUT, what, ": no answer within the deadline (", done, " of ", n, " bytes read)");
    }
    const ssize_t got = ::recv(s.fd(), p + done, n - done, 0);
    if (got == 0) fail(MOE_EP_ERROR_BOOTSTRAP, what, ": the connection was closed (", done, " of ", n, " bytes read)");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      fail_io(what, "recv");
    }
    done += static_cast<size_t>(got);
  }
}

void write_exact(const Socket& s, const void* data, size_t n, Deadline deadline, const std::string& what) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    if (!wait_for(s.fd(), POLLOUT, deadline)) {
      fail(MOE_EP_ERROR_TIMEOUT, what, ": could not send within the deadline (", done, " of ", n, " bytes sent)");
    }
    const ssize_t sent = ::send(s.fd(), p + done, n - done, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      fail_io(what, "send");
    }
    done += static_cast<size_t>(sent);
  }
}

namespace {

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) ::freeaddrinfo(list);
  }
};

void resolve(const std::string& host, int32_t port, bool passive, AddrInfo* out, const std::string& what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
  if (rc != 0) fail(MOE_EP_ERROR_BOOTSTRAP, what, ": cannot resolve \"", host, "\": ", ::gai_strerror(rc));
}

// One non-blocking connect attempt to one address, bounded by the deadline.
Socket try_connect(const addrinfo* a, Deadline deadline, std::string* why) {
  Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
  if (!s.valid()) {
    *why = std::strerror(errno);
    return Socket();
  }
  set_nonblocking(s.fd());
  if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
    *why = std::strerror(errno);
    return Socket();
  }
  if (!wait_for(s.fd(), POLLOUT, deadline)) {
    *why = "no answer before the deadline";
    return Socket();
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    *why = std::strerror(err);
    return Socket();
  }
  set_nodelay(s.fd());
  return s;
}

}  // namespace

Socket connect_to(const Address& address, Deadline deadline, const std::string& what) {
  AddrInfo info;
  resolve(address.host, address.port, false, &info, what);
  std::string why = "no address";
  for (const addrinfo* a = info.list; a != nullptr; a = a->ai_next) {
    Socket s = try_connect(a, deadline, &why);
    if (s.valid()) return s;
  }
  fail(MOE_EP_ERROR_BOOTSTRAP, what, ": cannot connect to ", address.host, ":", address.port, ": ", why);
}

Socket listen_on(const std::string& host, int32_t port, int32_t* bound_port) {
  const std::string what = "store server on " + host + ":" + std::to_string(port);
  AddrInfo info;
  resolve(host, port, true, &info, what);
  std::string why = "no address";
  for (const addrinfo* a = info.list; a != nullptr; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    const int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(s.fd(), 128) != 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&bound), &len);
    *bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    set_nonblocking(s.fd());
    return s;
  }
  fail(MOE_EP_ERROR_BOOTSTRAP, what, ": cannot listen: ", why);
}

Socket accept_until(const Socket& listener, Deadline deadline) {
  if (!wait_for(listener.fd(), POLLIN, deadline)) return Socket();
  Socket s(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s.valid()) return Socket();  // raced away, or the listener was shut down
  set_nonblocking(s.fd());
  set_nodelay(s.fd());
  return s;
}

}  // namespace moe_ep::store
