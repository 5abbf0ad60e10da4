#include "store/frame.hpp"

namespace moe_ep::store {

namespace {

void put(std::vector<uint8_t>& out, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[at + i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t take(const uint8_t* in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{in[at + i]} << (8 * i);
  return v;
}

bool refuse(std::string* error, const std::string& field, const std::string& expected, uint64_t got) {
  if (error) *error = "store frame: " + field + ": expected " + expected + ", got " + std::to_string(got);
  return false;
}

}  // namespace

std::vector<uint8_t> encode_request_header(const RequestHeader& h) {
  std::vector<uint8_t> out(kRequestHeaderBytes, 0);
  put(out, 0, kMagic, 4);
  put(out, 4, kVersion, 1);
  put(out, 5, static_cast<uint8_t>(h.op), 1);
  put(out, 6, h.flags, 2);
  put(out, 8, h.key_len, 4);
  put(out, 16, h.value_len, 8);
  put(out, 24, h.arg, 8);
  return out;
}

std::vector<uint8_t> encode_response_header(const ResponseHeader& h) {
  std::vector<uint8_t> out(kResponseHeaderBytes, 0);
  put(out, 0, kMagic, 4);
  put(out, 4, kVersion, 1);
  put(out, 5, static_cast<uint8_t>(h.code), 1);
  put(out, 8, h.value_len, 8);
  return out;
}

bool decode_request_header(const uint8_t* b, RequestHeader* out, std::string* error, uint64_t max_value) {
  if (take(b, 0, 4) != kMagic) return refuse(error, "magic", "0x5350454d", take(b, 0, 4));
  if (b[4] != kVersion) return refuse(error, "version", std::to_string(kVersion), b[4]);
  if (b[5] < kFirstOp || b[5] > kLastOp) return refuse(error, "op", "1..6", b[5]);
  if (take(b, 12, 4) != 0) return refuse(error, "reserved bytes 12..15", "0", take(b, 12, 4));
  RequestHeader h;
  h.op = static_cast<Op>(b[5]);
  h.flags = static_cast<uint16_t>(take(b, 6, 2));
  h.key_len = static_cast<uint32_t>(take(b, 8, 4));
  h.value_len = take(b, 16, 8);
  h.arg = take(b, 24, 8);
  const uint16_t allowed_flags = h.op == Op::compare_set ? kExpectAbsent : 0;
  if ((h.flags & ~allowed_flags) != 0) return refuse(error, "flags", "only known flags of the op", h.flags);
  if (h.key_len == 0 || h.key_len > kMaxKeyBytes) {
    return refuse(error, "key_len", "1.." + std::to_string(kMaxKeyBytes), h.key_len);
  }
  const bool carries_value = h.op == Op::set || h.op == Op::compare_set;
  const uint64_t value_limit = h.op == Op::compare_set ? 2 * max_value : max_value;
  if (!carries_value && h.value_len != 0) return refuse(error, "value_len (an op without a value)", "0", h.value_len);
  if (h.value_len > value_limit) return refuse(error, "value_len", "<= " + std::to_string(value_limit), h.value_len);
  if (h.op == Op::get && h.arg > kMaxWaitMs) return refuse(error, "wait_ms", "<= " + std::to_string(kMaxWaitMs), h.arg);
  if (h.op == Op::compare_set) {
    if (h.arg > h.value_len) return refuse(error, "expected_len", "<= value_len " + std::to_string(h.value_len), h.arg);
    if ((h.flags & kExpectAbsent) && h.arg != 0) return refuse(error, "expected_len (expect absent)", "0", h.arg);
    if (h.arg > max_value || h.value_len - h.arg > max_value) {
      return refuse(error, "compare_set values", "each <= " + std::to_string(max_value), h.value_len);
    }
  }
  if ((h.op == Op::set || h.op == Op::erase || h.op == Op::erase_prefix) && h.arg != 0) {
    return refuse(error, "arg", "0", h.arg);
  }
  *out = h;
  return true;
}

bool decode_response_header(const uint8_t* b, ResponseHeader* out, std::string* error, uint64_t max_value) {
  if (take(b, 0, 4) != kMagic) return refuse(error, "magic", "0x5350454d", take(b, 0, 4));
  if (b[4] != kVersion) return refuse(error, "version", std::to_string(kVersion), b[4]);
  if (b[5] > kLastCode) return refuse(error, "code", "0..3", b[5]);
  if (b[6] != 0 || b[7] != 0) return refuse(error, "reserved bytes 6..7", "0", take(b, 6, 2));
  ResponseHeader h;
  h.code = static_cast<Code>(b[5]);
  h.value_len = take(b, 8, 8);
  if (h.value_len > max_value) return refuse(error, "value_len", "<= " + std::to_string(max_value), h.value_len);
  *out = h;
  return true;
}

std::vector<uint8_t> encode_i64(int64_t v) {
  std::vector<uint8_t> out(8);
  put(out, 0, static_cast<uint64_t>(v), 8);
  return out;
}

bool decode_i64(const std::vector<uint8_t>& bytes, int64_t* v) {
  if (bytes.size() != 8) return false;
  *v = static_cast<int64_t>(take(bytes.data(), 0, 8));
  return true;
}

}  // namespace moe_ep::store
