// Reading the library's environment variables (tuning and measurement
// switches of the GPU backends), one way for every backend: what "on" means
// and which integers count.
#pragma once

#include <stdint.h>

namespace moe_ep {

// True when `name` is set to `on_value`, or, with `on_value` NULL, when it is
// unset or set to anything but "0".
bool environment_switch(const char* name, const char* on_value = nullptr);

// A positive integer below 65536 from `name`; 0 when unset, not a number, or
// out of that range (the caller's default then applies).
int32_t int_from_environment(const char* name);

}  // namespace moe_ep
