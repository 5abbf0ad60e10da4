// Diagnostics of the NVLink backend on stderr, chosen by the environment:
// MOE_EP_LOG=info prints what create chose (handle type, sizes, SMs);
// anything else, or unset, prints nothing.
#pragma once

#include <sstream>
#include <string>

namespace moe_ep {

bool log_info_enabled();
void log_info_line(const std::string& line);

template <typename... Parts>
void log_info(const Parts&... parts) {
  if (!log_info_enabled()) return;
  std::ostringstream os;
  (os << ... << parts);
  log_info_line(os.str());
}

}  // namespace moe_ep
