#include "nvlink/tuning_environment.hpp"

namespace moe_ep {

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

int32_t small_dispatch_tokens_from_environment() {
  const int32_t n = int_from_environment("MOE_EP_SMALL_DISPATCH_TOKENS");
  if (n <= 0) return kDefaultSmallDispatchTokens;
  return n > kMaxSmallDispatchTokens ? kMaxSmallDispatchTokens : n;
}

bool dispatch_bulk_from_environment(int32_t sm_budget) {
  return forced_switch("MOE_EP_DISPATCH_BULK").value_or(sm_budget <= kDispatchBulkAutoMaxSms);
}

std::optional<bool> dispatch_lookback_from_environment() { return forced_switch("MOE_EP_DISPATCH_LOOKBACK"); }

bool dispatch_looks_back(std::optional<bool> forced, int32_t num_tokens, int32_t blocks) {
  return forced.value_or(num_tokens > kLookbackMinTokens && blocks <= kLookbackMaxBlocks);
}

}  // namespace moe_ep
