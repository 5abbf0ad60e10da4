// The store server: a StoreTable behind a TCP listener, served by threads of
// the process that creates it (moe_ep_store_serve).  Host it in a process
// that outlives the ranks (a launcher, an orchestrator): a rank that hosts it
// takes the store down when it dies, and every survivor with it.
//
// One thread accepts, one thread serves each connection.  A frame must arrive
// whole within kFrameTimeoutMs (frame.hpp) of its first byte, its header is checked
// before its body is read (frame.hpp), and a malformed frame closes that
// connection only.  Destruction stops every thread and wakes every waiting get.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "store/socket_io.hpp"
#include "store/store_table.hpp"

namespace moe_ep::store {

constexpr size_t kMaxConnections = 4096;

class StoreServer {
 public:
  // Listens on host:port (port 0: any free port).  BOOTSTRAP if it cannot.
  // A started frame must arrive whole, and a response leave, within frame_timeout_ms.
  StoreServer(const std::string& host, int32_t port, int64_t frame_timeout_ms = kFrameTimeoutMs);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int32_t port() const { return port_; }

 private:
  struct Connection {
    Socket socket;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop();
  void serve(Connection* c);
  void reap_finished();

  StoreTable table_;
  Socket listener_;
  int32_t port_ = 0;
  const int64_t frame_timeout_ms_;
  std::atomic<bool> stopping_{false};
  std::mutex connections_mutex_;
  std::list<std::unique_ptr<Connection>> connections_;
  std::thread acceptor_;
};

}  // namespace moe_ep::store
