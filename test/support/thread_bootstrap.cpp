#include "thread_bootstrap.hpp"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moe_ep_test {

namespace {

// A reusable barrier with a shared byte area for allgather, that can be
// aborted: every waiting and later call then fails at once.
class Group {
 public:
  explicit Group(int n) : n_(n) {}

  bool barrier() {
    std::unique_lock<std::mutex> lock(m_);
    return barrier_locked(lock);
  }

  bool allgather(int rank, const void* send, void* recv, size_t bytes) {
    std::unique_lock<std::mutex> lock(m_);
    if (area_.size() < bytes * n_) area_.resize(bytes * n_);
    if (!barrier_locked(lock)) return false;  // everyone sized the area (and finished reading the last one)
    std::memcpy(area_.data() + bytes * rank, send, bytes);
    if (!barrier_locked(lock)) return false;  // everyone wrote
    std::memcpy(recv, area_.data(), bytes * n_);
    return barrier_locked(lock);  // everyone read before the area is reused
  }

  // Callbacks currently inside the group.
  void enter() {
    std::lock_guard<std::mutex> lock(m_);
    ++inside_;
  }
  void leave() {
    std::lock_guard<std::mutex> lock(m_);
    --inside_;
    cv_.notify_all();  // under the lock: the group may be freed right after
  }

  // Fails every pending and later call, then waits until no callback is inside.
  void abort_and_drain() {
    std::unique_lock<std::mutex> lock(m_);
    aborted_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return inside_ == 0; });
  }

 private:
  bool barrier_locked(std::unique_lock<std::mutex>& lock) {
    if (aborted_) return false;
    const long gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    return generation_ != gen;
  }

  int n_;
  int arrived_ = 0;
  long generation_ = 0;
  int inside_ = 0;
  bool aborted_ = false;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<unsigned char> area_;
};

struct RankContext {
  Group* group;
  int rank;
  const Tamper* tamper;
  int64_t calls;
};

int32_t allgather_cb(void* ctx, const void* send, void* recv, size_t bytes) {
  auto* c = static_cast<RankContext*>(ctx);
  c->group->enter();
  bool ok = c->group->allgather(c->rank, send, recv, bytes);
  if (ok && c->tamper && *c->tamper) (*c->tamper)(c->rank, c->calls, recv, bytes);
  ++c->calls;
  c->group->leave();
  return ok ? 0 : -1;
}

int32_t barrier_cb(void* ctx) {
  auto* c = static_cast<RankContext*>(ctx);
  c->group->enter();
  const bool ok = c->group->barrier();
  c->group->leave();
  return ok ? 0 : -1;
}

}  // namespace

void run_ranks(int world_size, const std::function<void(int, const moe_ep_bootstrap_t&)>& body,
               const Tamper& tamper) {
  Group group(world_size);
  std::vector<RankContext> contexts(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    contexts[r] = RankContext{&group, r, &tamper, 0};
    threads.emplace_back([&, r] {
      moe_ep_bootstrap_t b;
      moe_ep_bootstrap_init(&b, sizeof b);
      b.rank = r;
      b.world_size = world_size;
      b.ctx = &contexts[r];
      b.allgather = allgather_cb;
      b.barrier = barrier_cb;
      try {
        body(r, b);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  group.abort_and_drain();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

moe_ep_bootstrap_t single_rank_bootstrap() {
  moe_ep_bootstrap_t b;
  moe_ep_bootstrap_init(&b, sizeof b);
  b.rank = 0;
  b.world_size = 1;
  b.allgather = [](void*, const void* send, void* recv, size_t bytes) -> int32_t {
    std::memcpy(recv, send, bytes);
    return 0;
  };
  b.barrier = [](void*) -> int32_t { return 0; };
  return b;
}

}  // namespace moe_ep_test
