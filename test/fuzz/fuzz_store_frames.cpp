// libFuzzer target of the store's frame protocol and key/value table
// (src/store): the input is a stream of request frames as a client would send
// them.  Each header is decoded with the server's checks; a header they
// accept, with its key and value, is applied to a table (gets do not wait),
// and the answer must be what the op promises: a set is read back, a swap
// holds the desired value, an add answers 8 bytes, a malformed header is
// refused with a message naming the field.  Every 16 bytes are also decoded
// as a response header (what a client checks).  A crash, a sanitizer report
// or a broken promise is a bug.  Built by -DMOE_EP_BUILD_FUZZER=ON.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "store/frame.hpp"
#include "store/store_table.hpp"

using namespace moe_ep::store;

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

// Small limits, so that the fuzzer reaches the checks with short inputs.
constexpr uint64_t kFuzzMaxValue = 4096;

void apply_and_check(StoreTable& table, const RequestHeader& h, const std::string& key,
                     const std::vector<uint8_t>& value) {
  const Response r = table.apply(h, key, value, /*max_wait_ms=*/0);
  RequestHeader get;
  get.op = Op::get;
  get.key_len = static_cast<uint32_t>(key.size());
  switch (h.op) {
    case Op::set:
      require(r.code == Code::ok || r.code == Code::error);
      if (r.code == Code::ok) require(table.apply(get, key, {}, 0).value == value);
      break;
    case Op::add: require(r.code == Code::error || (r.code == Code::ok && r.value.size() == 8)); break;
    case Op::compare_set:
      if (r.code == Code::ok) {
        const std::vector<uint8_t> desired(value.begin() + static_cast<std::ptrdiff_t>(h.arg), value.end());
        require(table.apply(get, key, {}, 0).value == desired);
      }
      break;
    case Op::erase: require(r.code == Code::ok && table.apply(get, key, {}, 0).code == Code::not_found); break;
    case Op::get: require(r.code == Code::ok || r.code == Code::not_found); break;
    case Op::erase_prefix: require(r.code == Code::ok); break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (size_t at = 0; at + kResponseHeaderBytes <= size; at += kResponseHeaderBytes) {
    ResponseHeader r;
    std::string error;
    require(decode_response_header(data + at, &r, &error) || !error.empty());
  }
  StoreTable table(1 << 16);
  size_t at = 0;
  while (at + kRequestHeaderBytes <= size) {
    RequestHeader h;
    std::string error;
    if (!decode_request_header(data + at, &h, &error, kFuzzMaxValue)) {
      require(error.find("store frame: ") == 0);
      return 0;  // the server closes the connection here
    }
    require(h.key_len >= 1 && h.key_len <= kMaxKeyBytes && h.value_len <= 2 * kFuzzMaxValue);
    at += kRequestHeaderBytes;
    if (size - at < h.key_len + h.value_len) return 0;  // the frame is cut short: the server would time out
    const std::string key(reinterpret_cast<const char*>(data + at), h.key_len);
    at += h.key_len;
    const std::vector<uint8_t> value(data + at, data + at + h.value_len);
    at += h.value_len;
    apply_and_check(table, h, key, value);
  }
  return 0;
}
