#include "store/store_server.hpp"

#include <system_error>
#include <vector>

#include "common/log.hpp"
#include "error.hpp"

namespace moe_ep::store {

StoreServer::StoreServer(const std::string& host, int32_t port, int64_t frame_timeout_ms)
    : frame_timeout_ms_(frame_timeout_ms) {
  if (port < 0 || port > 65535) fail_argument("port", "0 (any free port) or 1..65535", port);
  listener_ = listen_on(host, port, &port_);
  try {
    acceptor_ = std::thread([this] { accept_loop(); });
  } catch (const std::system_error& e) {
    fail(MOE_EP_ERROR_OUT_OF_MEMORY, "could not start the store server's thread: ", e.what());
  }
}

StoreServer::~StoreServer() {
  stopping_ = true;
  table_.stop();
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard<std::mutex> lock(connections_mutex_);
  for (auto& c : connections_) c->socket.shutdown();
  for (auto& c : connections_) {
    if (c->thread.joinable()) c->thread.join();
  }
}

void StoreServer::reap_finished() {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void StoreServer::accept_loop() {
  while (!stopping_) {
    Socket s = accept_until(listener_, deadline_after_ms(100));  // wakes to notice stopping_
    reap_finished();
    if (!s.valid()) continue;
    std::lock_guard<std::mutex> lock(connections_mutex_);
    if (connections_.size() >= kMaxConnections) continue;  // refused: closed on scope exit
    auto c = std::make_unique<Connection>();
    c->socket = std::move(s);
    Connection* raw = c.get();
    try {
      c->thread = std::thread([this, raw] { serve(raw); });
    } catch (const std::system_error&) {
      continue;  // no thread for it: the connection closes
    }
    connections_.push_back(std::move(c));
  }
}

namespace {

constexpr uint64_t kReadChunkBytes = uint64_t{1} << 20;

// Reads one request.  False when the client closed between frames or the
// server is stopping; throws on a malformed or stalled frame.
bool read_request(const Socket& s, const std::atomic<bool>& stopping, int64_t timeout_ms, RequestHeader* h,
                  std::string* key, std::vector<uint8_t>* value) {
  while (!wait_readable(s, deadline_after_ms(100))) {
    if (stopping) return false;
  }
  if (stopping) return false;
  uint8_t header[kRequestHeaderBytes];
  const Deadline deadline = deadline_after_ms(timeout_ms);
  read_exact(s, header, sizeof header, deadline, "store server: request header");
  std::string error;
  if (!decode_request_header(header, h, &error)) throw Error(MOE_EP_ERROR_INVALID_INPUT, error);
  key->resize(h->key_len);
  read_exact(s, &(*key)[0], h->key_len, deadline, "store server: request key");
  // The value grows as its bytes arrive (<= 2 x kMaxValueBytes, checked): a
  // client that announces a large value and sends nothing costs no memory.
  value->clear();
  for (uint64_t left = h->value_len; left != 0;) {
    const size_t n = static_cast<size_t>(left < kReadChunkBytes ? left : kReadChunkBytes);
    const size_t have = value->size();
    value->resize(have + n);
    read_exact(s, value->data() + have, n, deadline, "store server: request value");
    left -= n;
  }
  return true;
}

void write_response(const Socket& s, const Response& r, int64_t timeout_ms) {
  ResponseHeader h;
  h.code = r.code;
  h.value_len = r.value.size();
  const std::vector<uint8_t> header = encode_response_header(h);
  const Deadline deadline = deadline_after_ms(timeout_ms);
  write_exact(s, header.data(), header.size(), deadline, "store server: response header");
  write_exact(s, r.value.data(), r.value.size(), deadline, "store server: response value");
}

}  // namespace

void StoreServer::serve(Connection* c) {
  try {
    RequestHeader h;
    std::string key;
    std::vector<uint8_t> value;
    while (read_request(c->socket, stopping_, frame_timeout_ms_, &h, &key, &value)) {
      write_response(c->socket, table_.apply(h, key, value), frame_timeout_ms_);
    }
  } catch (const std::exception& e) {
    // A client that broke the protocol, stalled or vanished loses its connection only.
    log_info("store server: connection closed: ", e.what());
  }
  c->socket.shutdown();  // the client sees the end; the fd is closed when the entry is reaped
  c->done = true;
}

}  // namespace moe_ep::store
