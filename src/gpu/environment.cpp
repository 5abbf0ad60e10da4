#include "gpu/environment.hpp"

#include <cstdlib>
#include <cstring>

namespace moe_ep {

bool environment_switch(const char* name, const char* on_value) {
  const char* v = std::getenv(name);
  if (on_value == nullptr) return v == nullptr || std::strcmp(v, "0") != 0;
  return v != nullptr && std::strcmp(v, on_value) == 0;
}

std::optional<bool> forced_switch(const char* name) {
  if (environment_switch(name, "1")) return true;
  if (environment_switch(name, "0")) return false;
  return std::nullopt;
}

int32_t int_from_environment(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n > 0 && n < 65536 ? static_cast<int32_t>(n) : 0;
}

}  // namespace moe_ep
