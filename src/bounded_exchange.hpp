// Bootstrap exchanges that the caller can give up on: the callbacks run on a
// worker thread owned by this object, and the calling thread waits for each
// exchange with a deadline (timeout_ms).  This is how the HOST backend and
// create's agreement steps honour timeout_ms although the callbacks block.
//
// On expiry the call throws TIMEOUT and the exchange is abandoned: every later
// call throws TIMEOUT at once (the group is out of step).  The worker may still
// be inside a callback that never returns; it owns the buffers it works on
// (shared with this object, never the caller's memory), so destroying this
// object neither waits for it nor frees memory it still uses: the destructor
// joins an idle worker and detaches an abandoned one, which exits when its
// callback returns.  Until then that callback still runs with the bootstrap's
// ctx (documented in the public header).
//
// The callbacks thus run on another thread than the caller's.  The caller's
// current CUDA context goes with them (gpu_context.hpp); other thread-local
// state does not (an MPI library initialised with MPI_THREAD_SINGLE, say: the
// public header states the requirement).
//
// With one rank there is no peer to wait for: the callbacks run on the calling
// thread, and no worker is started.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>

#include "bootstrap.hpp"

namespace moe_ep {

class BoundedExchange final : public Exchange {
 public:
  BoundedExchange(const Bootstrap& bootstrap, int32_t timeout_ms);
  ~BoundedExchange() override;
  BoundedExchange(const BoundedExchange&) = delete;
  BoundedExchange& operator=(const BoundedExchange&) = delete;

  int32_t rank() const override { return bootstrap_.rank(); }
  int32_t world_size() const override { return bootstrap_.world_size(); }
  int32_t timeout_ms() const { return timeout_ms_; }
  // True once an exchange timed out (the group is out of step for good).
  bool abandoned() const { return abandoned_; }

  struct Shared;  // what the worker thread shares with this object (bounded_exchange.cpp)

 protected:
  void do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const override;

 private:
  void start_worker() const;

  Bootstrap bootstrap_;
  int32_t timeout_ms_;
  void* gpu_context_;  // the creating thread's CUDA context, made current on the worker
  mutable std::shared_ptr<Shared> shared_;
  mutable std::thread worker_;
  mutable bool abandoned_ = false;
  mutable std::string abandoned_step_;
};

}  // namespace moe_ep
