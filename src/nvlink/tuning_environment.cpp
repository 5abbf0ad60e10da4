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

namespace {

// A positive token count from the environment, at most `most`; `fallback`
// where unset or not a positive number.
int32_t tokens_from_environment(const char* name, int32_t fallback, int32_t most) {
  const int32_t n = int_from_environment(name);
  if (n <= 0) return fallback;
  return n > most ? most : n;
}

}  // namespace

int32_t small_dispatch_tokens_from_environment() {
  return tokens_from_environment("MOE_EP_SMALL_DISPATCH_TOKENS", kDefaultSmallDispatchTokens, kMaxSmallDispatchTokens);
}

int32_t small_combine_tokens_from_environment() {
  return tokens_from_environment("MOE_EP_SMALL_COMBINE_TOKENS", kDefaultSmallCombineTokens, kMaxSmallCombineTokens);
}

bool dispatch_bulk_from_environment(int32_t sm_budget) {
  return forced_switch("MOE_EP_DISPATCH_BULK").value_or(sm_budget <= kDispatchBulkAutoMaxSms);
}

std::optional<bool> dispatch_lookback_from_environment() { return forced_switch("MOE_EP_DISPATCH_LOOKBACK"); }

bool dispatch_looks_back(std::optional<bool> forced, int32_t num_tokens, int32_t blocks) {
  return forced.value_or(num_tokens > kLookbackMinTokens && blocks <= kLookbackMaxBlocks);
}

}  // namespace moe_ep
