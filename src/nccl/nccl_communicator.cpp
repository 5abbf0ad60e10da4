#include "nccl/nccl_communicator.hpp"

#include <thread>

#include "collective_step.hpp"
#include "error.hpp"

namespace moe_ep {

namespace {

constexpr auto kPollInterval = std::chrono::microseconds(100);

std::chrono::steady_clock::time_point deadline_after(int32_t timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}

// NCCL's verdicts mapped to moe_ep statuses.
moe_ep_status_t status_of(nccl::Result r) {
  switch (r) {
    case 1: return MOE_EP_ERROR_CUDA;           // ncclUnhandledCudaError
    case 4:                                      // ncclInvalidArgument
    case nccl::kInvalidUsage: return MOE_EP_ERROR_UNSUPPORTED;
    case 2:                                      // ncclSystemError (sockets, shared memory)
    case 6: return MOE_EP_ERROR_BOOTSTRAP;      // ncclRemoteError: a peer failed
    default: return MOE_EP_ERROR_INTERNAL;
  }
}

}  // namespace

NcclCommunicator::NcclCommunicator(const nccl::Api& api, const Bootstrap& bootstrap, int32_t timeout_ms)
    : api_(api), rank_(bootstrap.rank()), timeout_ms_(timeout_ms) {
  nccl::UniqueId id{};
  run_then_agree(bootstrap, [&] {
    if (bootstrap.rank() != 0) return;
    const nccl::Result r = api_.GetUniqueId(&id);
    if (r != nccl::kSuccess) throw Error(status_of(r), api_.describe("ncclGetUniqueId", r, nullptr));
  });
  id = bootstrap.allgather_value(id)[0];

  run_then_agree(bootstrap, [&] {
    try {
      nccl::Config config = nccl::default_config(/*blocking=*/0);
      complete("ncclCommInitRankConfig",
               api_.CommInitRankConfig(&comm_, bootstrap.world_size(), id, bootstrap.rank(), &config));
    } catch (...) {
      close(false);
      throw;
    }
  });
}

nccl::Result NcclCommunicator::wait_ready(std::chrono::steady_clock::time_point deadline) const {
  nccl::Result state = nccl::kInProgress;
  while (true) {
    const nccl::Result r = api_.CommGetAsyncError(comm_, &state);
    if (r != nccl::kSuccess) return r;
    if (state != nccl::kInProgress || std::chrono::steady_clock::now() > deadline) return state;
    std::this_thread::sleep_for(kPollInterval);
  }
}

void NcclCommunicator::complete(const char* call, nccl::Result result) {
  if (result == nccl::kInProgress && comm_ != nullptr) result = wait_ready(deadline_after(timeout_ms_));
  if (result == nccl::kSuccess) return;
  if (result == nccl::kInProgress) {
    abort();
    fail(MOE_EP_ERROR_TIMEOUT, call, " on rank ", rank_, ": NCCL did not finish within timeout_ms = ", timeout_ms_,
         " (a peer is missing or stalled); the communicator was aborted");
  }
  fail(status_of(result), api_.describe(call, result, comm_), " (rank ", rank_, ")");
}

nccl::Result NcclCommunicator::async_error() const {
  if (comm_ == nullptr) return aborted_ ? nccl::kRemoteAborted : nccl::kSuccess;
  nccl::Result state = nccl::kSuccess;
  const nccl::Result r = api_.CommGetAsyncError(comm_, &state);
  return r != nccl::kSuccess ? r : state;
}

void NcclCommunicator::abort() noexcept {
  if (comm_ == nullptr) return;
  aborted_ = true;
  api_.CommAbort(comm_);  // frees the communicator: never used again
  comm_ = nullptr;
}

void NcclCommunicator::close(bool healthy) noexcept {
  if (comm_ == nullptr) return;
  if (healthy && !aborted_) {
    const auto deadline = deadline_after(timeout_ms_);
    nccl::Result r = api_.CommFinalize ? api_.CommFinalize(comm_) : nccl::kSuccess;
    if (r == nccl::kInProgress) r = wait_ready(deadline);
    if (r == nccl::kSuccess) {
      r = api_.CommDestroy(comm_);  // local after a finalize
      if (r == nccl::kSuccess || r == nccl::kInProgress) {
        comm_ = nullptr;
        return;
      }
    }
  }
  abort();
}

}  // namespace moe_ep
