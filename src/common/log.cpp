#include "common/log.hpp"

#include <atomic>
#include <cstdio>

#include "common/tuning_registry.hpp"

namespace moe_ep {

namespace {

constexpr int kLevelUnread = -1;
std::atomic<int> g_level{kLevelUnread};  // the index of MOE_EP_LOG's choice: 0 off, 1 info, 2 debug

int read_level() noexcept { return static_cast<int>(knob_value_or_default(Knob::kLog)); }

}  // namespace

bool log_info_enabled() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kLevelUnread) {
    level = read_level();
    g_level.store(level, std::memory_order_relaxed);
  }
  return level >= 1;
}

void refresh_log_level() noexcept { g_level.store(read_level(), std::memory_order_relaxed); }

void log_info_line(const std::string& line) { std::fprintf(stderr, "[moe_ep] %s\n", line.c_str()); }

}  // namespace moe_ep
