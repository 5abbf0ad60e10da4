// Reading the library's environment variables (tuning and measurement
// switches of the GPU backends), one way for every backend: what "on" means
// and which integers count.
#pragma once

#include <stdint.h>

#include <optional>

namespace moe_ep {

// True when `name` is set to `on_value`, or, with `on_value` NULL, when it is
// unset or set to anything but "0".
bool environment_switch(const char* name, const char* on_value = nullptr);

// A forced choice: true when `name` is "1", false when it is "0", none
// otherwise (unset or anything else: the caller's automatic choice applies).
std::optional<bool> forced_switch(const char* name);

// A positive integer below 65536 from `name`; 0 when unset, not a number, or
// out of that range (the caller's default then applies).
int32_t int_from_environment(const char* name);

}  // namespace moe_ep
