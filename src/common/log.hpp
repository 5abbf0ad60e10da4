// Diagnostics on stderr, chosen by MOE_EP_LOG (common/tuning_registry.hpp):
// info or debug prints what create chose (backend, handle type, sizes, SMs),
// the knobs taken from the environment and the paths the calls take; off, or
// unset, prints nothing.
#pragma once

#include <sstream>
#include <string>

namespace moe_ep {

bool log_info_enabled();
void log_info_line(const std::string& line);
// Reads MOE_EP_LOG again (create does, so that each handle logs as its
// environment says); until then the first log_info reads it.
void refresh_log_level() noexcept;

template <typename... Parts>
void log_info(const Parts&... parts) {
  if (!log_info_enabled()) return;
  std::ostringstream os;
  (os << ... << parts);
  log_info_line(os.str());
}

}  // namespace moe_ep
