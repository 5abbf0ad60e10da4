// The store's keys and values, and what each request does to them: the part
// of the server that knows nothing about sockets (so that a fuzzer can drive
// it with decoded frames).  Thread-safe; a get may wait for its key.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "store/frame.hpp"

namespace moe_ep::store {

struct Response {
  Code code = Code::ok;
  std::vector<uint8_t> value;
};

class StoreTable {
 public:
  // Refuses a set that would hold more than `max_total_bytes` of values.
  explicit StoreTable(uint64_t max_total_bytes = uint64_t{16} << 30) : max_total_(max_total_bytes) {}

  // Applies one decoded request (lengths already checked by decode_request_header;
  // key and value are its body).  A get waits at most min(arg, max_wait_ms)
  // ms, and returns early once stop() was called.
  Response apply(const RequestHeader& h, const std::string& key, const std::vector<uint8_t>& value,
                 uint64_t max_wait_ms = kMaxWaitMs);

  // Ends every wait (server shutdown): waiting gets answer not_found.
  void stop();
  size_t size() const;

 private:
  Response get(const std::string& key, uint64_t wait_ms);
  Response set(const std::string& key, const std::vector<uint8_t>& value);
  Response add(const std::string& key, int64_t delta);
  Response compare_set(const RequestHeader& h, const std::string& key, const std::vector<uint8_t>& value);
  Response erase(const std::string& key, bool prefix);
  bool fits(uint64_t old_bytes, uint64_t new_bytes) const;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> values_;
  uint64_t total_ = 0;
  const uint64_t max_total_;
  bool stopped_ = false;
};

}  // namespace moe_ep::store
