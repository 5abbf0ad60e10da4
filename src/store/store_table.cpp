#include "store/store_table.hpp"

#include <algorithm>
#include <chrono>

namespace moe_ep::store {

namespace {

Response error_response(const std::string& message) {
  return Response{Code::error, std::vector<uint8_t>(message.begin(), message.end())};
}

}  // namespace

Response StoreTable::apply(const RequestHeader& h, const std::string& key, const std::vector<uint8_t>& value,
                           uint64_t max_wait_ms) {
  switch (h.op) {
    case Op::set: return set(key, value);
    case Op::get: return get(key, h.arg < max_wait_ms ? h.arg : max_wait_ms);
    case Op::add: return add(key, static_cast<int64_t>(h.arg));
    case Op::compare_set: return compare_set(h, key, value);
    case Op::erase: return erase(key, false);
    case Op::erase_prefix: return erase(key, true);
  }
  return error_response("unknown op");
}

void StoreTable::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  changed_.notify_all();
}

size_t StoreTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return values_.size();
}

bool StoreTable::fits(uint64_t old_bytes, uint64_t new_bytes) const {
  // total_ >= old_bytes (old_bytes is part of it); every term <= 2^31 * 16: no overflow.
  return total_ - old_bytes + new_bytes <= max_total_;
}

Response StoreTable::get(const std::string& key, uint64_t wait_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  auto found = values_.end();
  changed_.wait_until(lock, deadline, [&] {
    found = values_.find(key);
    return found != values_.end() || stopped_;
  });
  found = values_.find(key);
  if (found == values_.end()) return Response{Code::not_found, {}};
  return Response{Code::ok, found->second};
}

Response StoreTable::set(const std::string& key, const std::vector<uint8_t>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    const uint64_t old_bytes = it == values_.end() ? 0 : it->second.size();
    if (!fits(old_bytes, value.size())) return error_response("the store is full (its byte limit)");
    total_ = total_ - old_bytes + value.size();
    values_[key] = value;
  }
  changed_.notify_all();
  return Response{};
}

Response StoreTable::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> result;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    int64_t now = 0;
    if (it != values_.end() && !decode_i64(it->second, &now)) {
      return error_response("add: the key holds " + std::to_string(it->second.size()) +
                            " bytes, not an 8-byte counter");
    }
    if (it == values_.end() && !fits(0, 8)) return error_response("the store is full (its byte limit)");
    // Wraps like unsigned arithmetic: defined, and a counter never gets near it.
    now = static_cast<int64_t>(static_cast<uint64_t>(now) + static_cast<uint64_t>(delta));
    result = encode_i64(now);
    if (it == values_.end()) total_ += 8;
    values_[key] = result;
  }
  changed_.notify_all();
  return Response{Code::ok, result};
}

Response StoreTable::compare_set(const RequestHeader& h, const std::string& key, const std::vector<uint8_t>& value) {
  const bool expect_absent = (h.flags & kExpectAbsent) != 0;
  const size_t expected_len = static_cast<size_t>(h.arg);  // <= value.size(), checked by the decoder
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end() && !expect_absent) return Response{Code::not_found, {}};
    if (it != values_.end()) {
      const bool equal = !expect_absent && it->second.size() == expected_len &&
                         std::equal(it->second.begin(), it->second.end(), value.begin());
      if (!equal) return Response{Code::mismatch, it->second};
    }
    const uint64_t old_bytes = it == values_.end() ? 0 : it->second.size();
    const uint64_t new_bytes = value.size() - expected_len;
    if (!fits(old_bytes, new_bytes)) return error_response("the store is full (its byte limit)");
    total_ = total_ - old_bytes + new_bytes;
    values_[key].assign(value.begin() + static_cast<std::ptrdiff_t>(expected_len), value.end());
  }
  changed_.notify_all();
  return Response{};
}

Response StoreTable::erase(const std::string& key, bool prefix) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = values_.lower_bound(key);
  while (it != values_.end() && it->first.compare(0, key.size(), key) == 0) {
    if (!prefix && it->first.size() != key.size()) break;
    total_ -= it->second.size();
    it = values_.erase(it);
    if (!prefix) break;
  }
  return Response{};
}

}  // namespace moe_ep::store
