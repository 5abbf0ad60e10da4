// Unsigned division by a divisor fixed at create (experts per rank), as a
// multiply and a shift: the kernels compute an expert's owner for every pick.
// Plain C++ so that a host test can check it against `/` exhaustively.
#pragma once

#include <stdint.h>

#include "common/host_device.h"

namespace moe_ep {
namespace kernels {

// shift = ceil(log2(divisor)); magic = floor(2^32 * (2^shift - divisor) / divisor) + 1.
// Then n / divisor == (umulhi(n, magic) + n) >> shift for every 32-bit n
// (the sum is formed in 64 bits, so it cannot overflow).
inline void compute_division_magic(uint32_t divisor, uint32_t* magic, uint32_t* shift) {
  uint32_t s = 0;
  while ((uint64_t{1} << s) < divisor) ++s;
  *shift = s;
  *magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - divisor)) / divisor + 1);
}

MOE_EP_HOST_DEVICE uint32_t divide_by_magic(uint32_t n, uint32_t magic, uint32_t shift) {
#if defined(__CUDA_ARCH__)
  const uint32_t hi = __umulhi(n, magic);
#else
  const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * magic) >> 32);
#endif
  return static_cast<uint32_t>((static_cast<uint64_t>(hi) + n) >> shift);
}

}  // namespace kernels
}  // namespace moe_ep
