// The store's wire protocol: one request frame, one response frame, over a
// TCP stream.  Nothing from the network is trusted (docs/reliability.md, "The
// store"): a header is decoded field by field into host integers, checked
// against fixed limits before a single body byte is read, and every length
// used afterwards is one that passed those checks.
//
// Request:  header (kRequestHeaderBytes), then key_len key bytes, then
//           value_len value bytes.
// Response: header (kResponseHeaderBytes), then value_len value bytes.
// Integers are little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace moe_ep::store {

constexpr uint32_t kMagic = 0x5350454d;  // "MEPS"
constexpr uint8_t kVersion = 1;
constexpr size_t kRequestHeaderBytes = 32;
constexpr size_t kResponseHeaderBytes = 16;
constexpr uint32_t kMaxKeyBytes = 1024;
constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;  // one record of one rank's dispatch
constexpr uint64_t kMaxWaitMs = 3600 * 1000;            // a blocking get waits at most an hour
constexpr int64_t kFrameTimeoutMs = 10000;              // a started frame (or a response) moves within this

enum class Op : uint8_t {
  set = 1,           // key := value
  get = 2,           // value of key; waits up to arg ms for it to appear
  add = 3,           // key := key + (int64)arg (absent = 0); returns the new value (8 bytes)
  compare_set = 4,   // value = expected (arg bytes) + desired; flag kExpectAbsent: expected is "no key"
  erase = 5,         // removes key (absent is fine)
  erase_prefix = 6,  // removes every key that starts with key
};
constexpr uint8_t kFirstOp = 1, kLastOp = 6;
constexpr uint16_t kExpectAbsent = 1;  // compare_set: swap only if the key does not exist

enum class Code : uint8_t {
  ok = 0,         // done; get: value follows; add: the new value; compare_set: swapped
  not_found = 1,  // get: no such key within the wait; compare_set: expected a value, key absent
  mismatch = 2,   // compare_set: not swapped, the current value follows
  error = 3,      // refused: the message follows
};
constexpr uint8_t kLastCode = 3;

struct RequestHeader {
  Op op = Op::get;
  uint16_t flags = 0;
  uint32_t key_len = 0;
  uint64_t value_len = 0;
  uint64_t arg = 0;
};

struct ResponseHeader {
  Code code = Code::ok;
  uint64_t value_len = 0;
};

// Encoders (a header's bytes).
std::vector<uint8_t> encode_request_header(const RequestHeader& h);
std::vector<uint8_t> encode_response_header(const ResponseHeader& h);

// Decoders: true when the bytes are a well-formed header within the limits
// (value lengths at most `max_value`), else false with *error saying which
// field is wrong, its value and what was expected.  Read exactly the header size.
bool decode_request_header(const uint8_t* bytes, RequestHeader* out, std::string* error,
                           uint64_t max_value = kMaxValueBytes);
bool decode_response_header(const uint8_t* bytes, ResponseHeader* out, std::string* error,
                            uint64_t max_value = kMaxValueBytes);

// Little-endian helpers for 8-byte counters.
std::vector<uint8_t> encode_i64(int64_t v);
bool decode_i64(const std::vector<uint8_t>& bytes, int64_t* v);

}  // namespace moe_ep::store
