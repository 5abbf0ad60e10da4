// A connection to the store server (store_server.hpp) and its operations.
// Every operation ends by a deadline: the wait the caller asked for plus
// kFrameTimeoutMs for the frames themselves.  What the server answers is
// checked like any frame from the network (frame.hpp).  A broken connection
// is BOOTSTRAP naming the store's address; the client does not reconnect
// (the store outlives the ranks, so a broken connection means it is gone).
// One thread at a time per client (the handle's threading rule); the calls are
// serialised inside anyway.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/frame.hpp"
#include "store/socket_io.hpp"

namespace moe_ep::store {

class StoreClient {
 public:
  // Connects within connect_timeout_ms.  `argument` names the address in errors.
  StoreClient(const std::string& address, int64_t connect_timeout_ms, const std::string& argument = "store address");

  const std::string& address() const { return address_; }

  void set(const std::string& key, const std::vector<uint8_t>& value);
  // The value, or nothing when the key did not appear within wait_ms.
  std::optional<std::vector<uint8_t>> get(const std::string& key, int64_t wait_ms);
  int64_t add(const std::string& key, int64_t delta);
  // Sets key to desired if it holds `expected` (nullopt: if it does not exist).
  // Returns the value the key holds afterwards (desired when swapped) and
  // whether this call swapped it.
  std::vector<uint8_t> compare_set(const std::string& key, const std::optional<std::vector<uint8_t>>& expected,
                                   const std::vector<uint8_t>& desired, bool* swapped);
  void erase(const std::string& key);
  void erase_prefix(const std::string& prefix);

 private:
  struct Reply {
    Code code;
    std::vector<uint8_t> value;
  };
  Reply call(RequestHeader h, const std::string& key, const std::vector<uint8_t>& value, int64_t wait_ms);
  Reply expect(Reply r, const std::string& op, const std::string& key, std::initializer_list<Code> allowed) const;

  std::string address_;
  std::mutex mutex_;
  Socket socket_;
  bool broken_ = false;
};

}  // namespace moe_ep::store
