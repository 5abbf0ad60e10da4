// Bounds the NVLink split phases' stream waits (docs/overlap.md, "NVLink
// backend").  A receive half waits for its peers with a stream memory
// operation, which has no timeout of its own: a dead peer would stall the
// stream forever.  This thread reads each slot's ReceiveWatch in host-mapped
// memory (no synchronisation with the device): a slot that has been waiting
// with no receive finishing for timeout_ms is handed to `release`, which
// ends the stream wait (the receive kernel then gives up on the missing
// peers and records the timeout, naming one).  It sleeps between looks, so it
// costs nothing on the device and next to nothing on the host.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "moe_ep_kernels.h"

namespace moe_ep {

// The watchdog's judgement, apart from its thread: which slots have been
// waiting, with no receive of theirs completing, for `timeout` (each reported
// once per stall).
class ReceiveStallDetector {
 public:
  ReceiveStallDetector(int32_t slots, std::chrono::milliseconds timeout);

  // One look at the watches at time `now`: the slots to release.
  std::vector<int32_t> look(const kernels::HostTimeoutMirror& mirror, std::chrono::steady_clock::time_point now);

 private:
  struct SlotTrack {
    bool waiting = false;
    uint32_t completed = 0;  // the watch's count when this wait was first seen
    std::chrono::steady_clock::time_point since{};
    bool released = false;
  };
  std::chrono::milliseconds timeout_;
  std::vector<SlotTrack> tracks_;
};

class ReceiveWatchdog {
 public:
  using Release = std::function<void(int32_t slot)>;  // called on the watchdog's thread, noexcept

  // Starts the thread.  `mirror` outlives this object.
  ReceiveWatchdog(const kernels::HostTimeoutMirror* mirror, int32_t slots, int32_t timeout_ms, Release release);
  // Stops and joins the thread.
  ~ReceiveWatchdog();
  ReceiveWatchdog(const ReceiveWatchdog&) = delete;
  ReceiveWatchdog& operator=(const ReceiveWatchdog&) = delete;

  // How often the thread looks: often enough that a stall is released within
  // about timeout_ms + one period, rarely enough to be free.
  static std::chrono::milliseconds period(int32_t timeout_ms);

 private:
  void run();

  const kernels::HostTimeoutMirror* mirror_;
  std::chrono::milliseconds period_;
  ReceiveStallDetector detector_;
  Release release_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace moe_ep
