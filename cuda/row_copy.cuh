// Warp-cooperative copies of byte rows.  Rows may have any length and any
// alignment (no multiple-of-16 rule): the bulk moves in the widest unit that
// source and destination share, the ragged head and tail byte by byte.
#pragma once

#include <stdint.h>

namespace moe_ep {
namespace kernels {

constexpr int kWarpSize = 32;

// kInFlight loads per lane are issued before their stores (more bytes in
// flight per warp where a kernel has the registers for them).
template <typename Unit, int kInFlight>
__device__ __forceinline__ void warp_copy_units(char* dst, const char* src, int64_t units, int lane) {
  Unit* d = reinterpret_cast<Unit*>(dst);
  const Unit* s = reinterpret_cast<const Unit*>(src);
  int64_t i = lane;
  for (; i + (kInFlight - 1) * kWarpSize < units; i += kInFlight * kWarpSize) {
    Unit u[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) u[k] = s[i + k * kWarpSize];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) d[i + k * kWarpSize] = u[k];
  }
  if (kInFlight <= 4) {  // the NVLink kernels' copies: one unit at a time (their registers are counted)
    for (; i < units; i += kWarpSize) d[i] = s[i];
  } else if (i < units) {  // the last, partial step: its loads in flight together too
    Unit u[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (i + k * kWarpSize < units) u[k] = s[i + k * kWarpSize];
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      if (i + k * kWarpSize < units) d[i + k * kWarpSize] = u[k];
    }
  }
}

// Copies `bytes` bytes from src to dst with the whole warp, kInFlight 16-byte
// loads per lane in flight (4 unless the caller asks for more; narrower units,
// for rows whose ends do not share a 16-byte alignment, keep 4).
template <int kInFlight = 4>
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
    case 16: warp_copy_units<uint4, kInFlight>(d, s, units, lane); break;
    case 8: warp_copy_units<uint2, 4>(d, s, units, lane); break;
    case 4: warp_copy_units<uint32_t, 4>(d, s, units, lane); break;
    case 2: warp_copy_units<uint16_t, 4>(d, s, units, lane); break;
    default: warp_copy_units<uint8_t, 4>(d, s, units, lane); break;
  }
  const int64_t done = head + units * unit;
  for (int64_t i = done + lane; i < bytes; i += kWarpSize) dst[i] = src[i];
}

}  // namespace kernels
}  // namespace moe_ep
