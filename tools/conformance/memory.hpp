// A buffer in host memory (HOST backend) or in device memory (CUDA backends),
// with the copies and fills the tool needs, so the rest of the code does not
// care where the tensors live.
#pragma once

#include <cstdint>
#include <vector>

#include "moe_ep_c.h"
#include "result_reader.hpp"

namespace moe_ep_tool {

// Where a backend wants its tensors.
struct Place {
  bool device = false;  // false: host memory
  int device_id = 0;
  moe_ep_device_t dlpack() const;
};

class Buffer {
 public:
  Buffer() = default;
  Buffer(const Place& place, uint64_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  const Place& place() const { return place_; }

  // Stream-ordered on the device (stream may be NULL); synchronous on the host.
  void upload(const void* src, uint64_t bytes, void* stream);
  template <typename T>
  void upload(const std::vector<T>& v, void* stream) { upload(v.data(), v.size() * sizeof(T), stream); }
  void fill(uint8_t byte, void* stream);

 private:
  Place place_;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// Copies `bytes` from a result tensor's memory (host or device) into a vector;
// synchronises the stream first when the data is on the device.
std::vector<uint8_t> download(const Place& place, const void* data, uint64_t bytes, void* stream);
// download() as a moe_ep_verify::MemoryReader, for reading results back.
moe_ep_verify::MemoryReader reader(const Place& place, void* stream);
// Fills result memory in place (poisoning a result the caller owns until combine).
void fill_at(const Place& place, void* data, uint64_t bytes, uint8_t byte, void* stream);
// Copies `bytes` of host memory to `data` (host or device memory of `place`);
// finished on return (the source may be freed).
void upload_at(const Place& place, void* data, const void* src, uint64_t bytes, void* stream);

}  // namespace moe_ep_tool
