// A store server (moe_ep_store_serve) on a free loopback port for as long as
// the object lives, and the address its clients connect to.
#pragma once

#include <cstdint>
#include <string>

#include "moe_ep_c.h"

namespace moe_ep_test {

class LoopbackStore {
 public:
  LoopbackStore() {
    int32_t port = 0;
    if (moe_ep_store_serve("127.0.0.1", 0, &store_) == MOE_EP_SUCCESS &&
        moe_ep_store_port(store_, &port) == MOE_EP_SUCCESS) {
      address_ = "127.0.0.1:" + std::to_string(port);
    }
  }
  ~LoopbackStore() { moe_ep_store_destroy(&store_); }
  LoopbackStore(const LoopbackStore&) = delete;
  LoopbackStore& operator=(const LoopbackStore&) = delete;

  // False when the server could not start (moe_ep_last_error says why).
  bool serving() const { return !address_.empty(); }
  // "127.0.0.1:<port>"; empty when not serving.
  const std::string& address() const { return address_; }

 private:
  moe_ep_store_t store_ = nullptr;
  std::string address_;
};

}  // namespace moe_ep_test
