// One NCCL communicator of a handle, created non-blocking so that every wait
// on it is bounded: create, every NCCL call that answers "in progress", and
// destroy poll ncclCommGetAsyncError against a deadline of timeout_ms, and
// abort the communicator when it passes (ncclCommAbort is local: it never
// waits for a peer).
#pragma once

#include <chrono>
#include <string>

#include "bootstrap.hpp"
#include "nccl/nccl_library.hpp"

namespace moe_ep {

class NcclCommunicator {
 public:
  // Collective: rank 0's unique id travels through the bootstrap.  Throws
  // (every rank, agreed) on failure or when timeout_ms passes.
  NcclCommunicator(const nccl::Api& api, const Bootstrap& bootstrap, int32_t timeout_ms);
  ~NcclCommunicator() { close(false); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  const nccl::Api& api() const { return api_; }
  nccl::CommHandle get() const { return comm_; }
  bool aborted() const { return aborted_; }

  // The result of an NCCL call on this communicator: success returns,
  // "in progress" is polled to completion within timeout_ms, anything else
  // (or the deadline) throws naming `call`.
  void complete(const char* call, nccl::Result result);
  // NCCL's asynchronous error (kSuccess while healthy); never throws.
  nccl::Result async_error() const;
  // Local and immediate: kernels of this communicator exit, later calls fail.
  void abort() noexcept;
  // healthy: finalize and destroy within timeout_ms (abort if it passes);
  // otherwise abort.  Idempotent.
  void close(bool healthy) noexcept;

 private:
  // Polls until the communicator is no longer "in progress"; returns its state.
  nccl::Result wait_ready(std::chrono::steady_clock::time_point deadline) const;

  const nccl::Api& api_;
  int32_t rank_;
  int32_t timeout_ms_;
  nccl::CommHandle comm_ = nullptr;
  bool aborted_ = false;
};

}  // namespace moe_ep
