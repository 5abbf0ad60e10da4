#include "common/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace moe_ep {

bool log_info_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MOE_EP_LOG");
    return v != nullptr && (std::strcmp(v, "info") == 0 || std::strcmp(v, "INFO") == 0 ||
                            std::strcmp(v, "debug") == 0);
  }();
  return enabled;
}

void log_info_line(const std::string& line) { std::fprintf(stderr, "[moe_ep] %s\n", line.c_str()); }

}  // namespace moe_ep
