// An in-process bootstrap: the ranks of a group as threads of this process,
// exchanging bytes through shared memory.  The tool measures numbers, not
// transport, so one process stands in for the whole EP group.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "moe_ep_c.h"

namespace moe_ep_wire_error {

class ThreadGroup {
 public:
  explicit ThreadGroup(int32_t world_size);
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  // The bootstrap of rank `rank`; valid while this group lives.
  moe_ep_bootstrap_t bootstrap(int32_t rank);

  // Runs body(rank, bootstrap) on world_size threads and joins them; the
  // first exception a body throws is rethrown after the join.
  void run(const std::function<void(int32_t rank, const moe_ep_bootstrap_t& b)>& body);

 private:
  struct Member {
    ThreadGroup* group;
    int32_t rank;
  };
  static int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes_per_rank);
  static int32_t barrier(void* ctx);
  void wait_all();

  int32_t world_size_;
  std::vector<Member> members_;
  std::vector<const void*> sends_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int32_t arrived_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace moe_ep_wire_error
