#include "nvlink/tuning_environment.hpp"

#include <cstdlib>
#include <cstring>

namespace moe_ep {

bool environment_switch(const char* name, const char* on_value) {
  const char* v = std::getenv(name);
  if (on_value == nullptr) return v == nullptr || std::strcmp(v, "0") != 0;
  return v != nullptr && std::strcmp(v, on_value) == 0;
}

int32_t int_from_environment(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return 0;
  const long n = std::strtol(v, nullptr, 10);
  return n > 0 && n < 65536 ? static_cast<int32_t>(n) : 0;
}

int32_t pull_copy_bytes_from_environment() {
  const int32_t n = int_from_environment("MOE_EP_PULL_COPY_BYTES");
  if (n <= 0) return kDefaultPullCopyBytes;
  if (n < 16) return 16;
  return n > 16384 ? 16384 : n / 16 * 16;
}

int32_t pull_producers_from_environment() {
  const int32_t n = int_from_environment("MOE_EP_PULL_PRODUCERS");
  if (n <= 0) return kDefaultPullProducers;
  return n > kMaxPullProducers ? kMaxPullProducers : n;
}

}  // namespace moe_ep
