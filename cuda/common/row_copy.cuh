// Warp-cooperative copies of byte rows.  Rows may have any length and any
// alignment (no multiple-of-16 rule): the bulk moves in the widest unit that
// source and destination share, the ragged head and tail byte by byte.
#pragma once

#include <stdint.h>

namespace moe_ep {
namespace kernels {

constexpr int kWarpSize = 32;

template <typename Unit>
__device__ __forceinline__ void warp_copy_units(char* dst, const char* src, int64_t units, int lane) {
  Unit* d = reinterpret_cast<Unit*>(dst);
  const Unit* s = reinterpret_cast<const Unit*>(src);
  int64_t i = lane;
  // Four loads in flight per lane before the stores.
  for (; i + 3 * kWarpSize < units; i += 4 * kWarpSize) {
    const Unit a = s[i], b = s[i + kWarpSize], c = s[i + 2 * kWarpSize], e = s[i + 3 * kWarpSize];
    d[i] = a;
    d[i + kWarpSize] = b;
    d[i + 2 * kWarpSize] = c;
    d[i + 3 * kWarpSize] = e;
  }
  for (; i < units; i += kWarpSize) d[i] = s[i];
}

// Copies `bytes` bytes from src to dst with the whole warp.
__device__ inline void warp_copy_bytes(char* dst, const char* src, int64_t bytes, int lane) {
  if (bytes <= 0) return;
  const uintptr_t mismatch = reinterpret_cast<uintptr_t>(dst) ^ reinterpret_cast<uintptr_t>(src);
  // Widest unit in which both pointers can be aligned by the same head.
  int unit = 16;
  while (unit > 1 && (mismatch & static_cast<uintptr_t>(unit - 1)) != 0) unit >>= 1;
  int64_t head = static_cast<int64_t>((unit - (reinterpret_cast<uintptr_t>(src) & (unit - 1))) & (unit - 1));
  if (head > bytes) head = bytes;
  for (int64_t i = lane; i < head; i += kWarpSize) dst[i] = src[i];
  const int64_t units = (bytes - head) / unit;
  char* d = dst + head;
  const char* s = src + head;
  switch (unit) {
    case 16: warp_copy_units<uint4>(d, s, units, lane); break;
    case 8: warp_copy_units<uint2>(d, s, units, lane); break;
    case 4: warp_copy_units<uint32_t>(d, s, units, lane); break;
    case 2: warp_copy_units<uint16_t>(d, s, units, lane); break;
    default: warp_copy_units<uint8_t>(d, s, units, lane); break;
  }
  const int64_t done = head + units * unit;
  for (int64_t i = done + lane; i < bytes; i += kWarpSize) dst[i] = src[i];
}

}  // namespace kernels
}  // namespace moe_ep
