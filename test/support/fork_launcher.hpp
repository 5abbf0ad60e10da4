// Ranks as forked processes, so that one can die (kill -9) while the others
// live on: what mpirun's abort-on-death does not allow.  The store the
// survivors agree through (moe_ep_store_serve) runs in a process of its own,
// started first, so that this process stays single-threaded and every fork
// is safe; it outlives every rank and ends with the launcher.
//
// A child runs its body and _exits with the body's return value; it never
// returns into the test framework.  Children are killed when the launcher
// goes away (and when the test process dies: PR_SET_PDEATHSIG).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace moe_ep_test {

class ForkLauncher {
 public:
  ForkLauncher();  // starts the store process; throws std::runtime_error if it cannot
  ~ForkLauncher();
  ForkLauncher(const ForkLauncher&) = delete;
  ForkLauncher& operator=(const ForkLauncher&) = delete;

  // "127.0.0.1:<port>" of the store.
  const std::string& store_address() const { return address_; }

  // Forks a child that runs body() and exits with its return value (an
  // exception: exit code 2).
  pid_t spawn(const std::function<int()>& body);
  // kill -9, and reaps it.
  void kill_now(pid_t pid);
  // The child's exit code; -1 if it is still running after timeout_ms (it is
  // then killed), 128 + signal if a signal ended it.
  int wait_exit(pid_t pid, int timeout_ms);

 private:
  pid_t store_pid_ = -1;
  int store_pipe_ = -1;  // closing it ends the store process
  std::string address_;
  std::vector<pid_t> children_;
};

// Monotonic nanoseconds (CLOCK_MONOTONIC: the same clock in every process of the machine).
int64_t monotonic_ns();

}  // namespace moe_ep_test
