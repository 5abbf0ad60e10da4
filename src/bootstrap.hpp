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

// What moves bytes between the ranks of a group: the caller's callbacks
// directly (Bootstrap), or through a thread with a deadline (BoundedExchange).
class Exchange {
 public:
  virtual ~Exchange() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;

  // Gathers bytes_per_rank bytes from every rank into recv (world_size times
  // as many).  `step` names the exchange in error messages.  Throws BOOTSTRAP
  // when a callback fails, TIMEOUT when a bounded exchange runs out of time.
  void allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step = "exchange") const {
    do_allgather(send, recv, bytes_per_rank, step);
  }

  template <typename T>
  std::vector<T> allgather_value(const T& value, const char* step = "exchange") const {
    std::vector<T> all(static_cast<size_t>(world_size()));
    allgather(&value, all.data(), sizeof(T), step);
    return all;
  }

  // Collective.  Every rank passes its local outcome; if any rank failed, every
  // rank throws: the failing rank its own error, the others an error of the
  // same status naming the first failing rank and its message.  A peer's
  // outcome is untrusted: its message is read within its fixed-size field and
  // an unknown status becomes INVALID_INPUT.
  void agree(moe_ep_status_t local_status, const std::string& local_message) const;

 protected:
  virtual void do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const = 0;
};

// The caller's bootstrap callbacks, called on the calling thread: errors become
// BOOTSTRAP exceptions quoting the callback's own message.
class Bootstrap final : public Exchange {
 public:
  // Validates the struct (INVALID_ARGUMENT naming the field otherwise).
  explicit Bootstrap(const moe_ep_bootstrap_t* user);

  int32_t rank() const override { return b_.rank; }
  int32_t world_size() const override { return b_.world_size; }

  void barrier() const;

 protected:
  void do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const override;

 private:
  moe_ep_bootstrap_t b_{};
};

}  // namespace moe_ep
