// Reading the caller's versioned structs (SPEC §3): every public struct starts
// with uint32_t struct_size.  A smaller (older) struct is accepted and its
// missing tail defaulted; a larger (newer) one only if the unknown bytes are 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "error.hpp"

namespace moe_ep {

// Copies the caller's struct over `defaults` (already holding this library's
// defaults) and returns the merged struct.  `name` is used in messages.
template <typename T>
T read_versioned(const T* user, const T& defaults, const char* name) {
  if (user == nullptr) fail_argument(name, "a non-NULL pointer", "NULL");
  uint32_t user_size = 0;
  std::memcpy(&user_size, user, sizeof(user_size));
  constexpr size_t kMinimum = sizeof(uint32_t) + sizeof(int32_t);  // struct_size + one field
  if (user_size < kMinimum) {
    fail_argument(std::string(name) + "->struct_size",
                  "at least " + std::to_string(kMinimum) + " (call the *_init function first)",
                  user_size);
  }
  if (user_size > sizeof(T)) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(user);
    for (size_t i = sizeof(T); i < user_size; ++i) {
      if (bytes[i] != 0) {
        fail_argument(std::string(name),
                      "zero bytes beyond the " + std::to_string(sizeof(T)) +
                          " this library knows (struct from a newer header)",
                      "a non-zero byte at offset " + std::to_string(i));
      }
    }
  }
  T merged = defaults;
  std::memcpy(&merged, user, user_size < sizeof(T) ? user_size : sizeof(T));
  merged.struct_size = static_cast<uint32_t>(sizeof(T));
  return merged;
}

// Writes `value` into the caller's output struct up to the caller's struct_size.
template <typename T>
void write_versioned(T* user, const T& value, const char* name) {
  if (user == nullptr) fail_argument(name, "a non-NULL pointer", "NULL");
  uint32_t user_size = 0;
  std::memcpy(&user_size, user, sizeof(user_size));
  if (user_size < sizeof(uint32_t) * 2) {
    fail_argument(std::string(name) + "->struct_size",
                  "at least 8 (call the *_init function first)", user_size);
  }
  const size_t n = user_size < sizeof(T) ? user_size : sizeof(T);
  std::memcpy(reinterpret_cast<unsigned char*>(user) + sizeof(uint32_t),
              reinterpret_cast<const unsigned char*>(&value) + sizeof(uint32_t),
              n - sizeof(uint32_t));
}

}  // namespace moe_ep
