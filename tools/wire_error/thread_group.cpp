#include "thread_group.hpp"

#include <cstring>
#include <exception>
#include <thread>

namespace moe_ep_wire_error {

ThreadGroup::ThreadGroup(int32_t world_size)
    : world_size_(world_size), members_(static_cast<size_t>(world_size)), sends_(static_cast<size_t>(world_size)) {
  for (int32_t r = 0; r < world_size; ++r) members_[static_cast<size_t>(r)] = {this, r};
}

moe_ep_bootstrap_t ThreadGroup::bootstrap(int32_t rank) {
  moe_ep_bootstrap_t b;
  moe_ep_bootstrap_init(&b, sizeof(b));
  b.rank = rank;
  b.world_size = world_size_;
  b.ctx = &members_[static_cast<size_t>(rank)];
  b.allgather = &ThreadGroup::allgather;
  b.barrier = &ThreadGroup::barrier;
  return b;
}

// Every member of the group enters, the last one wakes the others.
void ThreadGroup::wait_all() {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t generation = generation_;
  if (++arrived_ == world_size_) {
    arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  changed_.wait(lock, [&] { return generation_ != generation; });
}

// Each rank posts its buffer, copies every rank's once all have posted, and
// leaves once every rank has copied (a send buffer stays valid until then).
int32_t ThreadGroup::allgather(void* ctx, const void* send, void* recv, size_t bytes_per_rank) {
  Member* m = static_cast<Member*>(ctx);
  ThreadGroup& g = *m->group;
  g.sends_[static_cast<size_t>(m->rank)] = send;
  g.wait_all();
  for (int32_t r = 0; r < g.world_size_; ++r) {
    if (bytes_per_rank != 0) {
      std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(r) * bytes_per_rank, g.sends_[static_cast<size_t>(r)],
                  bytes_per_rank);
    }
  }
  g.wait_all();
  return 0;
}

int32_t ThreadGroup::barrier(void* ctx) {
  static_cast<Member*>(ctx)->group->wait_all();
  return 0;
}

void ThreadGroup::run(const std::function<void(int32_t rank, const moe_ep_bootstrap_t& b)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world_size_));
  for (int32_t r = 0; r < world_size_; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, bootstrap(r));
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace moe_ep_wire_error
