// The caller's bootstrap callbacks behind a small C++ face: errors become
// BOOTSTRAP exceptions, and "did every rank succeed?" is one call, so that a
// failure on one rank fails create on every rank instead of hanging the others.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep {

class Bootstrap {
 public:
  // Validates the struct (INVALID_ARGUMENT naming the field otherwise).
  explicit Bootstrap(const moe_ep_bootstrap_t* user);

  int32_t rank() const { return b_.rank; }
  int32_t world_size() const { return b_.world_size; }

  void allgather(const void* send, void* recv, size_t bytes_per_rank) const;
  void barrier() const;

  template <typename T>
  std::vector<T> allgather_value(const T& value) const {
    std::vector<T> all(static_cast<size_t>(world_size()));
    allgather(&value, all.data(), sizeof(T));
    return all;
  }

  // Collective.  Every rank passes its local outcome; if any rank failed, every
  // rank throws: the failing rank its own error, the others an error of the
  // same status naming the first failing rank and its message.
  void agree(moe_ep_status_t local_status, const std::string& local_message) const;

 private:
  moe_ep_bootstrap_t b_{};
};

}  // namespace moe_ep
