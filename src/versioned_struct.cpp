#include "versioned_struct.hpp"

namespace moe_ep {

void zero_struct_tail(void* user, size_t from, size_t to) noexcept {
  if (to > from) std::memset(static_cast<unsigned char*>(user) + from, 0, to - from);
}

}  // namespace moe_ep
