#include "thread_bootstrap.hpp"

#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace moe_ep_test {

namespace {

// A reusable barrier with a shared byte area for allgather.
class Group {
 public:
  explicit Group(int n) : n_(n) {}

  void barrier() {
    std::unique_lock<std::mutex> lock(m_);
    const long gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }

  void allgather(int rank, const void* send, void* recv, size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (area_.size() < bytes * n_) area_.resize(bytes * n_);
    }
    barrier();  // everyone sized the area (and finished reading the last one)
    std::memcpy(area_.data() + bytes * rank, send, bytes);
    barrier();  // everyone wrote
    std::memcpy(recv, area_.data(), bytes * n_);
    barrier();  // everyone read before the area is reused
  }

 private:
  int n_;
  int arrived_ = 0;
  long generation_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<unsigned char> area_;
};

struct RankContext {
  Group* group;
  int rank;
};

int32_t allgather_cb(void* ctx, const void* send, void* recv, size_t bytes) {
  auto* c = static_cast<RankContext*>(ctx);
  c->group->allgather(c->rank, send, recv, bytes);
  return 0;
}

int32_t barrier_cb(void* ctx) {
  static_cast<RankContext*>(ctx)->group->barrier();
  return 0;
}

}  // namespace

void run_ranks(int world_size, const std::function<void(int, const moe_ep_bootstrap_t&)>& body) {
  Group group(world_size);
  std::vector<RankContext> contexts(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    contexts[r] = RankContext{&group, r};
    threads.emplace_back([&, r] {
      moe_ep_bootstrap_t b;
      moe_ep_bootstrap_init(&b);
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
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace moe_ep_test
