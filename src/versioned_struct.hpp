// Reading and writing the caller's versioned structs: every public struct
// starts with uint32_t struct_size, which must be one of the sizes listed in
// struct_layouts.hpp (a field boundary of a released layout, or a newer
// header's larger size up to kMaxStructSize; never smaller than the first
// released layout).  A smaller (older) input struct gets this library's
// defaults for its missing tail; a larger (newer) one is accepted only if the
// bytes this library does not know are all zero.  Nothing the library writes
// (an *_init(), a dispatch or combine result) goes past the caller's size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "error.hpp"
#include "struct_layouts.hpp"

namespace moe_ep {

// Zeroes bytes [from, to) of the caller's struct.  Out of line on purpose: the
// caller's object may be larger than the T this library knows (a newer
// header), which the compiler cannot know.
void zero_struct_tail(void* user, size_t from, size_t to) noexcept;

// The smallest struct_size of T any released header declares: sizeof of the
// first released layout.  No binary can have a smaller struct.
template <typename T>
constexpr size_t first_released_size() {
  size_t first = sizeof(T);
  for (size_t released : StructLayout<T>::released_sizes) first = released < first ? released : first;
  return first;
}

// Whether `size` is a struct_size the library accepts for T (see struct_layouts.hpp).
template <typename T>
bool is_valid_struct_size(size_t size) {
  using L = StructLayout<T>;
  if (size < first_released_size<T>()) return false;
  for (size_t end : L::field_ends) {
    if (size == end) return true;
  }
  for (size_t released : L::released_sizes) {
    if (size == released) return true;
  }
  return size > sizeof(T) && size <= kMaxStructSize && size % alignof(T) == 0;
}

// The accepted sizes, for messages: "one of 20, 24 (...), or a multiple of 4 in (24, 1024]".
// `hint`: end with "call <init> first" (not for the init itself).
template <typename T>
std::string valid_struct_sizes_text(bool hint = true) {
  using L = StructLayout<T>;
  std::string s = "one of";
  const char* sep = " ";
  for (size_t end : L::field_ends) {
    if (end < first_released_size<T>()) continue;
    s += sep + std::to_string(end);
    sep = ", ";
  }
  for (size_t released : L::released_sizes) {
    bool listed = false;
    for (size_t end : L::field_ends) listed = listed || (end == released);
    if (!listed) s += sep + std::to_string(released);
  }
  return s + " (field boundaries of a released " + L::c_name + "), or a multiple of " + std::to_string(alignof(T)) +
         " in (" + std::to_string(sizeof(T)) + ", " + std::to_string(kMaxStructSize) + "] from a newer header" +
         (hint ? std::string("; call ") + L::init_name + " first" : std::string());
}

// Reads and checks the caller's struct_size; `name` is the argument ("params").
template <typename T>
uint32_t checked_struct_size(const T* user, const char* name) {
  if (user == nullptr) fail_argument(name, "a non-NULL pointer", "NULL");
  uint32_t user_size = 0;
  std::memcpy(&user_size, user, sizeof(user_size));
  if (!is_valid_struct_size<T>(user_size)) {
    fail_argument(std::string(name) + "->struct_size", valid_struct_sizes_text<T>(), user_size);
  }
  return user_size;
}

// Copies the caller's struct over `defaults` (already holding this library's
// defaults) and returns the merged struct.  `name` is used in messages.
template <typename T>
T read_versioned(const T* user, const T& defaults, const char* name) {
  const uint32_t user_size = checked_struct_size(user, name);
  if (user_size > sizeof(T)) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(user);
    for (size_t i = sizeof(T); i < user_size; ++i) {
      if (bytes[i] != 0) {
        fail_argument(std::string(name),
                      "zero bytes beyond the " + std::to_string(sizeof(T)) + " bytes of " +
                          StructLayout<T>::c_name + " this library knows (struct from a newer header)",
                      "a non-zero byte at offset " + std::to_string(i));
      }
    }
  }
  T merged = defaults;
  std::memcpy(&merged, user, user_size < sizeof(T) ? user_size : sizeof(T));
  merged.struct_size = static_cast<uint32_t>(sizeof(T));
  return merged;
}

// Checks an output struct before any work is done (so that a bad struct_size
// fails before anything is launched).
template <typename T>
void check_output_struct(const T* user, const char* name) {
  (void)checked_struct_size(user, name);
}

// Writes `value` into the caller's output struct up to the caller's
// struct_size: an older caller's tail is never touched; a newer caller's bytes
// beyond what this library knows are zeroed (its newer results read as absent).
template <typename T>
void write_versioned(T* user, const T& value, const char* name) {
  const uint32_t user_size = checked_struct_size(user, name);
  const size_t known = user_size < sizeof(T) ? user_size : sizeof(T);
  auto* out = reinterpret_cast<unsigned char*>(user);
  std::memcpy(out + sizeof(uint32_t), reinterpret_cast<const unsigned char*>(&value) + sizeof(uint32_t),
              known - sizeof(uint32_t));
  if (user_size > sizeof(T)) zero_struct_tail(user, sizeof(T), user_size);
}

// The body of every exported *_init(): writes `defaults` into the caller's
// struct up to the caller's size only, zeroes a newer caller's bytes beyond
// what this library knows, and sets struct_size to the caller's size.  `name`
// is the struct argument ("config").  Nothing is written on failure.
template <typename T>
void init_versioned(T* user, size_t struct_size, const T& defaults, const char* name) {
  if (user == nullptr) fail_argument(name, "a non-NULL pointer", "NULL");
  if (!is_valid_struct_size<T>(struct_size)) {
    fail_argument(std::string("struct_size of ") + StructLayout<T>::init_name,
                  std::string("sizeof(") + StructLayout<T>::c_name +
                      ") of the caller's header: " + valid_struct_sizes_text<T>(false),
                  std::to_string(struct_size));
  }
  const size_t known = struct_size < sizeof(T) ? struct_size : sizeof(T);
  auto* out = reinterpret_cast<unsigned char*>(user);
  std::memcpy(out, &defaults, known);
  if (struct_size > sizeof(T)) zero_struct_tail(user, sizeof(T), struct_size);
  const auto size32 = static_cast<uint32_t>(struct_size);
  std::memcpy(out, &size32, sizeof(size32));
}

}  // namespace moe_ep
