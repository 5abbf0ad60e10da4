#include "nvlink/receive_watchdog.hpp"

#include <algorithm>

namespace moe_ep {

ReceiveWatchdog::ReceiveWatchdog(const kernels::HostTimeoutMirror* mirror, int32_t slots, int32_t timeout_ms,
                                 Release release)
    : mirror_(mirror),
      timeout_(timeout_ms),
      release_(std::move(release)),
      tracks_(static_cast<size_t>(std::clamp(slots, 1, kernels::kMaxSlots))) {
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

void ReceiveWatchdog::look(std::chrono::steady_clock::time_point now) {
  for (size_t s = 0; s < tracks_.size(); ++s) {
    SlotTrack& t = tracks_[s];
    // completed before waiting: the device writes them in the other order
    // (common/split_ready.cuh); a stall is only a stall after timeout_ms of
    // both unchanged, far longer than either store takes to land.
    const uint32_t completed = mirror_->watch[s].completed;
    const bool waiting = mirror_->watch[s].waiting != 0;
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
      release_(static_cast<int32_t>(s));
    }
  }
}

void ReceiveWatchdog::run() {
  const std::chrono::milliseconds step = period(static_cast<int32_t>(timeout_.count()));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (wake_.wait_for(lock, step, [this] { return stop_; })) break;
    look(std::chrono::steady_clock::now());
  }
}

}  // namespace moe_ep
