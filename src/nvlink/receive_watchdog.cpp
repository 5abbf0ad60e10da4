#include "nvlink/receive_watchdog.hpp"

#include <algorithm>

namespace moe_ep {

ReceiveStallDetector::ReceiveStallDetector(int32_t slots, std::chrono::milliseconds timeout)
    : timeout_(timeout), tracks_(static_cast<size_t>(std::clamp(slots, 1, kernels::kMaxSlots))) {}

std::vector<int32_t> ReceiveStallDetector::look(const kernels::HostTimeoutMirror& mirror,
                                                std::chrono::steady_clock::time_point now) {
  std::vector<int32_t> stalled;
  for (size_t s = 0; s < tracks_.size(); ++s) {
    SlotTrack& t = tracks_[s];
    // completed before waiting: the device writes them in the other order
    // (common/split_ready.cuh); a stall is only a stall after timeout_ms of
    // both unchanged, far longer than either store takes to land.
    const uint32_t completed = mirror.watch[s].completed;
    const bool waiting = mirror.watch[s].waiting != 0;
    if (!waiting) {
      t = SlotTrack{};
      continue;
    }
    if (!t.waiting || t.completed != completed) {  // a new wait (or receives finished since): start its clock
      t = SlotTrack{};
      t.waiting = true;
      t.completed = completed;
      t.since = now;
      continue;
    }
    if (!t.released && now - t.since >= timeout_) {
      t.released = true;
      stalled.push_back(static_cast<int32_t>(s));
    }
  }
  return stalled;
}

ReceiveWatchdog::ReceiveWatchdog(const kernels::HostTimeoutMirror* mirror, int32_t slots, int32_t timeout_ms,
                                 Release release)
    : mirror_(mirror),
      period_(period(timeout_ms)),
      detector_(slots, std::chrono::milliseconds(timeout_ms)),
      release_(std::move(release)) {
  thread_ = std::thread([this] { run(); });
}

ReceiveWatchdog::~ReceiveWatchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::chrono::milliseconds ReceiveWatchdog::period(int32_t timeout_ms) {
  return std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms / 8, 1, 100));
}

void ReceiveWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (wake_.wait_for(lock, period_, [this] { return stop_; })) break;
    for (const int32_t slot : detector_.look(*mirror_, std::chrono::steady_clock::now())) release_(slot);
  }
}

}  // namespace moe_ep
