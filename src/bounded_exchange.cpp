#include "bounded_exchange.hpp"
#include "common/gpu_context.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <vector>

#include "checked_math.hpp"
#include "error.hpp"

namespace moe_ep {

// Everything the worker touches.  Held by the worker thread and by the
// BoundedExchange; whichever lets go last frees it.
struct BoundedExchange::Shared {
  Shared(const Bootstrap& b, void* context) : bootstrap(b), gpu_context(context) {}

  const Bootstrap bootstrap;
  void* const gpu_context;  // the caller's CUDA context, current on the worker too (gpu_context.hpp)
  std::mutex mutex;
  std::condition_variable changed;
  bool job_posted = false;  // a job waits for the worker
  bool job_done = false;    // the worker finished the last posted job
  bool stop = false;        // the owner is gone: exit when idle
  std::vector<uint8_t> send;
  std::vector<uint8_t> recv;
  size_t bytes_per_rank = 0;
  std::string step;
  moe_ep_status_t status = MOE_EP_SUCCESS;
  std::string message;
};

namespace {

void run_worker(std::shared_ptr<BoundedExchange::Shared> s);

}  // namespace

BoundedExchange::BoundedExchange(const Bootstrap& bootstrap, int32_t timeout_ms)
    : bootstrap_(bootstrap), timeout_ms_(timeout_ms), gpu_context_(current_gpu_context()) {
  if (timeout_ms <= 0) fail_argument("config->timeout_ms", "> 0", timeout_ms);
}

BoundedExchange::~BoundedExchange() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stop = true;
  }
  shared_->changed.notify_all();
  if (abandoned_) {
    worker_.detach();  // may be blocked in a callback for ever: never wait for it
  } else {
    worker_.join();  // idle: exits at once
  }
}

void BoundedExchange::start_worker() const {
  shared_ = std::make_shared<Shared>(bootstrap_, gpu_context_);
  try {
    worker_ = std::thread(run_worker, shared_);
  } catch (const std::system_error& e) {
    shared_.reset();
    fail(MOE_EP_ERROR_OUT_OF_MEMORY, "could not start the bootstrap exchange thread: ", e.what());
  }
}

void BoundedExchange::do_allgather(const void* send, void* recv, size_t bytes_per_rank, const char* step) const {
  if (abandoned_) {
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank(), ": not attempted, an earlier exchange (",
         abandoned_step_, ") timed out and the group is out of step");
  }
  if (world_size() == 1) {  // no peer to wait for
    bootstrap_.allgather(send, recv, bytes_per_rank, step);
    return;
  }
  const size_t total = checked_size(
      checked_mul(static_cast<uint64_t>(bytes_per_rank), static_cast<uint64_t>(world_size()), step), step);
  if (!worker_.joinable()) start_worker();
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  // The worker is idle here (every earlier job finished): the buffers are ours.
  const auto* bytes = static_cast<const uint8_t*>(send);
  s.send.assign(bytes, bytes + bytes_per_rank);
  s.recv.resize(total);
  s.bytes_per_rank = bytes_per_rank;
  s.step = step;
  s.job_done = false;
  s.job_posted = true;
  s.changed.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
  if (!s.changed.wait_until(lock, deadline, [&] { return s.job_done; })) {
    abandoned_ = true;
    abandoned_step_ = step;
    fail(MOE_EP_ERROR_TIMEOUT, step, " on rank ", rank(), ": the group did not complete the bootstrap exchange within ",
         "timeout_ms = ", timeout_ms_, " ms (a peer is late, has died, or made a different call); this handle is ",
         "unusable, destroy it (a callback that has not returned keeps running with the bootstrap's ctx)");
  }
  if (s.status != MOE_EP_SUCCESS) throw Error(s.status, s.message);
  if (total != 0) std::memcpy(recv, s.recv.data(), total);
}

namespace {

// Runs posted jobs until told to stop.  Holds its own reference to the shared
// state, so an abandoned worker never touches freed memory.
void run_worker(std::shared_ptr<BoundedExchange::Shared> s) {
  make_gpu_context_current(s->gpu_context);
  std::unique_lock<std::mutex> lock(s->mutex);
  for (;;) {
    s->changed.wait(lock, [&] { return s->job_posted || s->stop; });
    if (!s->job_posted) return;  // stop, and idle
    s->job_posted = false;
    lock.unlock();
    moe_ep_status_t status = MOE_EP_SUCCESS;
    std::string message;
    try {
      s->bootstrap.allgather(s->send.data(), s->recv.data(), s->bytes_per_rank, s->step.c_str());
    } catch (...) {
      status = status_of_current_exception(&message);
    }
    lock.lock();
    s->status = status;
    s->message = std::move(message);
    s->job_done = true;
    s->changed.notify_all();
  }
}

}  // namespace

}  // namespace moe_ep
