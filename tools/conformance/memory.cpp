#include "memory.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "errors.hpp"

namespace moe_ep_tool {

moe_ep_device_t Place::dlpack() const {
  return device ? moe_ep_device_t{MOE_EP_DEVICE_CUDA, device_id} : moe_ep_device_t{MOE_EP_DEVICE_CPU, 0};
}

Buffer::Buffer(const Place& place, uint64_t bytes) : place_(place), bytes_(bytes) {
  // At least one byte, so that a tensor of zero rows still has a non-NULL address.
  const uint64_t allocated = bytes ? bytes : 1;
  if (place_.device) {
    TOOL_CHECK_CUDA(cudaMalloc(&data_, allocated));
  } else {
    data_ = std::aligned_alloc(64, (allocated + 63) / 64 * 64);
    if (data_ == nullptr) fail("out of host memory allocating " + std::to_string(bytes) + " bytes");
  }
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (place_.device) {
    cudaFree(data_);  // a destructor cannot throw; a failure here changes no result
  } else {
    std::free(data_);
  }
}

Buffer::Buffer(Buffer&& o) noexcept
    : place_(o.place_), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    this->~Buffer();
    place_ = o.place_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void Buffer::upload(const void* src, uint64_t bytes, void* stream) {
  if (bytes > bytes_) fail("Buffer::upload: " + std::to_string(bytes) + " bytes into " + std::to_string(bytes_));
  upload_at(place_, data_, src, bytes, stream);
}

void upload_at(const Place& place, void* data, const void* src, uint64_t bytes, void* stream) {
  if (bytes == 0) return;
  if (place.device) {
    TOOL_CHECK_CUDA(cudaMemcpyAsync(data, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream)));
    // The source is pageable host memory that the caller may free: finish now.
    TOOL_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  } else {
    std::memcpy(data, src, bytes);
  }
}

void Buffer::fill(uint8_t byte, void* stream) { fill_at(place_, data_, bytes_, byte, stream); }

std::vector<uint8_t> download(const Place& place, const void* data, uint64_t bytes, void* stream) {
  std::vector<uint8_t> out(bytes);
  if (bytes == 0) return out;
  if (data == nullptr) fail("download: a result tensor of " + std::to_string(bytes) + " bytes has data == NULL");
  if (place.device) {
    const auto s = static_cast<cudaStream_t>(stream);
    TOOL_CHECK_CUDA(cudaMemcpyAsync(out.data(), data, bytes, cudaMemcpyDeviceToHost, s));
    TOOL_CHECK_CUDA(cudaStreamSynchronize(s));
  } else {
    std::memcpy(out.data(), data, bytes);
  }
  return out;
}

moe_ep_verify::MemoryReader reader(const Place& place, void* stream) {
  return [place, stream](const void* data, uint64_t bytes) { return download(place, data, bytes, stream); };
}

void fill_at(const Place& place, void* data, uint64_t bytes, uint8_t byte, void* stream) {
  if (bytes == 0 || data == nullptr) return;
  if (place.device) {
    TOOL_CHECK_CUDA(cudaMemsetAsync(data, byte, bytes, static_cast<cudaStream_t>(stream)));
  } else {
    std::memset(data, byte, bytes);
  }
}

}  // namespace moe_ep_tool
