#include "store/store_client.hpp"

#include "error.hpp"

namespace moe_ep::store {

StoreClient::StoreClient(const std::string& address, int64_t connect_timeout_ms, const std::string& argument)
    : address_(address) {
  socket_ =
      connect_to(parse_address(address, argument), deadline_after_ms(connect_timeout_ms), "the store at " + address);
}

StoreClient::Reply StoreClient::call(RequestHeader h, const std::string& key, const std::vector<uint8_t>& value,
                                     int64_t wait_ms) {
  const std::string what = "the store at " + address_;
  if (key.empty() || key.size() > kMaxKeyBytes) {
    fail(MOE_EP_ERROR_INTERNAL, what, ": key of ", key.size(), " bytes (expected 1..", kMaxKeyBytes, ")");
  }
  if (value.size() > 2 * kMaxValueBytes) {
    fail(MOE_EP_ERROR_INVALID_ARGUMENT, what, ": a value of ", value.size(), " bytes (the store takes up to ",
         kMaxValueBytes, ")");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_) fail(MOE_EP_ERROR_BOOTSTRAP, what, ": the connection broke earlier (the store is gone)");
  h.key_len = static_cast<uint32_t>(key.size());
  h.value_len = value.size();
  try {
    const Deadline send_by = deadline_after_ms(kFrameTimeoutMs);
    const std::vector<uint8_t> header = encode_request_header(h);
    write_exact(socket_, header.data(), header.size(), send_by, what);
    write_exact(socket_, key.data(), key.size(), send_by, what);
    write_exact(socket_, value.data(), value.size(), send_by, what);
    const Deadline answer_by = deadline_after_ms(wait_ms + kFrameTimeoutMs);
    uint8_t bytes[kResponseHeaderBytes];
    read_exact(socket_, bytes, sizeof bytes, answer_by, what);
    ResponseHeader r;
    std::string error;
    if (!decode_response_header(bytes, &r, &error)) throw Error(MOE_EP_ERROR_INVALID_INPUT, what + ": " + error);
    Reply reply{r.code, std::vector<uint8_t>(static_cast<size_t>(r.value_len))};
    read_exact(socket_, reply.value.data(), reply.value.size(), deadline_after_ms(kFrameTimeoutMs), what);
    return reply;
  } catch (...) {
    broken_ = true;  // out of step with the server: never reuse the stream
    throw;
  }
}

StoreClient::Reply StoreClient::expect(Reply r, const std::string& op, const std::string& key,
                                       std::initializer_list<Code> allowed) const {
  if (r.code == Code::error) {
    fail(MOE_EP_ERROR_BOOTSTRAP, "the store at ", address_, " refused ", op, " of \"", key,
         "\": ", std::string(r.value.begin(), r.value.end()));
  }
  for (Code c : allowed) {
    if (r.code == c) return r;
  }
  fail(MOE_EP_ERROR_INVALID_INPUT, "the store at ", address_, " answered ", op, " of \"", key, "\" with code ",
       static_cast<int>(r.code), ", which that op never returns");
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  RequestHeader h;
  h.op = Op::set;
  expect(call(h, key, value, 0), "set", key, {Code::ok});
}

std::optional<std::vector<uint8_t>> StoreClient::get(const std::string& key, int64_t wait_ms) {
  RequestHeader h;
  h.op = Op::get;
  if (wait_ms < 0) wait_ms = 0;
  h.arg = static_cast<uint64_t>(wait_ms) > kMaxWaitMs ? kMaxWaitMs : static_cast<uint64_t>(wait_ms);
  Reply r = expect(call(h, key, {}, static_cast<int64_t>(h.arg)), "get", key, {Code::ok, Code::not_found});
  if (r.code == Code::not_found) return std::nullopt;
  return std::move(r.value);
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  RequestHeader h;
  h.op = Op::add;
  h.arg = static_cast<uint64_t>(delta);
  const Reply r = expect(call(h, key, {}, 0), "add", key, {Code::ok});
  int64_t v = 0;
  if (!decode_i64(r.value, &v)) {
    fail(MOE_EP_ERROR_INVALID_INPUT, "the store at ", address_, " answered add of \"", key, "\" with ", r.value.size(),
         " bytes (expected 8)");
  }
  return v;
}

std::vector<uint8_t> StoreClient::compare_set(const std::string& key,
                                              const std::optional<std::vector<uint8_t>>& expected,
                                              const std::vector<uint8_t>& desired, bool* swapped) {
  RequestHeader h;
  h.op = Op::compare_set;
  std::vector<uint8_t> body;
  if (expected) {
    h.arg = expected->size();
    body = *expected;
  } else {
    h.flags = kExpectAbsent;
  }
  body.insert(body.end(), desired.begin(), desired.end());
  Reply r = expect(call(h, key, body, 0), "compare_set", key, {Code::ok, Code::mismatch, Code::not_found});
  *swapped = r.code == Code::ok;
  if (r.code == Code::ok) return desired;
  return std::move(r.value);  // mismatch: the current value; not_found: empty
}

void StoreClient::erase(const std::string& key) {
  RequestHeader h;
  h.op = Op::erase;
  expect(call(h, key, {}, 0), "erase", key, {Code::ok});
}

void StoreClient::erase_prefix(const std::string& prefix) {
  RequestHeader h;
  h.op = Op::erase_prefix;
  expect(call(h, prefix, {}, 0), "erase_prefix", prefix, {Code::ok});
}

}  // namespace moe_ep::store
