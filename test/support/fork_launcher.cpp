#include "fork_launcher.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "moe_ep_c.h"

namespace moe_ep_test {

int64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000000 + t.tv_nsec;
}

namespace {

void die_with_parent() { prctl(PR_SET_PDEATHSIG, SIGKILL); }

// The store process: serves until the launcher closes its end of the pipe.
[[noreturn]] void run_store(int port_out, int stop_in) {
  die_with_parent();
  moe_ep_store_t store = nullptr;
  int32_t port = 0;
  if (moe_ep_store_serve("127.0.0.1", 0, &store) != MOE_EP_SUCCESS || moe_ep_store_port(store, &port) != 0) port = -1;
  if (write(port_out, &port, sizeof port) != sizeof port) _exit(3);
  close(port_out);
  char byte;
  while (read(stop_in, &byte, 1) > 0) {
  }
  moe_ep_store_destroy(&store);
  _exit(0);
}

}  // namespace

ForkLauncher::ForkLauncher() {
  int port_pipe[2], stop_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(stop_pipe) != 0) throw std::runtime_error("fork launcher: pipe failed");
  store_pid_ = fork();
  if (store_pid_ < 0) throw std::runtime_error("fork launcher: fork failed");
  if (store_pid_ == 0) {
    close(port_pipe[0]);
    close(stop_pipe[1]);
    run_store(port_pipe[1], stop_pipe[0]);
  }
  close(port_pipe[1]);
  close(stop_pipe[0]);
  store_pipe_ = stop_pipe[1];
  int32_t port = -1;
  const bool got = read(port_pipe[0], &port, sizeof port) == sizeof port;
  close(port_pipe[0]);
  if (!got || port <= 0) throw std::runtime_error("fork launcher: the store did not start");
  address_ = "127.0.0.1:" + std::to_string(port);
}

ForkLauncher::~ForkLauncher() {
  for (pid_t pid : children_) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  close(store_pipe_);
  waitpid(store_pid_, nullptr, 0);
}

pid_t ForkLauncher::spawn(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork launcher: fork failed");
  if (pid == 0) {
    die_with_parent();
    close(store_pipe_);
    int code = 2;
    try {
      code = body();
    } catch (...) {
    }
    _exit(code);
  }
  children_.push_back(pid);
  return pid;
}

void ForkLauncher::kill_now(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
}

int ForkLauncher::wait_exit(pid_t pid, int timeout_ms) {
  const int64_t deadline = monotonic_ns() + int64_t(timeout_ms) * 1000000;
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      children_.erase(std::remove(children_.begin(), children_.end(), pid), children_.end());
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (monotonic_ns() > deadline) {
      kill_now(pid);
      return -1;
    }
    usleep(5000);
  }
}

}  // namespace moe_ep_test
