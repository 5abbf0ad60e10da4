// A stand-in backend for tests of the handle's own checks: it counts the calls
// that reach it and does nothing else (fused calls only, the default answers
// for split phases and masks, CPU tensors).  A test derives from it to change
// one answer.
#pragma once

#include <string>

#include "backend.hpp"

namespace moe_ep_test {

class CountingBackend : public moe_ep::Backend {
 public:
  explicit CountingBackend(const char* name) : name_(name) {}
  const char* name() const override { return name_; }
  moe_ep_device_t device() const override { return moe_ep_device_t{MOE_EP_DEVICE_CPU, 0}; }
  moe_ep::DispatchBuffers dispatch(const moe_ep::DispatchCall&, void*) override {
    ++calls;
    return {};
  }
  void* combine(const moe_ep::CombineCall&, void*) override {
    ++calls;
    return nullptr;
  }
  moe_ep_status_t poll_async_error(std::string*) override { return MOE_EP_SUCCESS; }
  void shutdown() noexcept override {}

  int calls = 0;  // dispatch and combine calls that reached the backend

 private:
  const char* name_;
};

}  // namespace moe_ep_test
