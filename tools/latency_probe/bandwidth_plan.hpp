// Group "bw" (per-SM bandwidth), its host-side arithmetic: which grid sizes
// run, how many bytes each block streams, and the rate from bytes and time.
// Plain C++ (no CUDA), tested on the CPU machine.
#pragma once

#include <cstddef>
#include <vector>

namespace moe_ep_probe {

// Bytes one block streams at most, and one kernel at most: a single block
// runs for about a millisecond or more even at local rates, and the largest
// grid reads five times the L2 (no run is served from a warm L2).
constexpr size_t kBandwidthBytesPerBlock = 32ull << 20;
constexpr size_t kBandwidthBytesPerKernel = 256ull << 20;
// Every block's slice is a multiple of this: one iteration of the register
// loops (512 threads x 8 vectors x 16 bytes) and a whole number of chunks per
// warp in the bulk loops (16 warps x 4 KiB, 4 warps x 16 KiB).
constexpr size_t kBandwidthSliceGranule = 64ull << 10;

// The grid sizes measured on a device with `sm_count` SMs: 1, 4, 8, 16, 24
// (those not above sm_count) and sm_count itself, ascending, each once.
// Empty when sm_count < 1.
std::vector<int> bandwidth_grids(int sm_count);

// The bytes one of `blocks` blocks streams: the kernel's share
// (min(blocks x per_block, per_kernel) / blocks) rounded down to the granule;
// 0 when blocks < 1 or the share is below one granule.
size_t bandwidth_slice_bytes(int blocks, size_t per_block, size_t per_kernel, size_t granule);

// GB/s (10^9 bytes per second) of `bytes` moved in `ms` milliseconds; 0 when
// ms is not positive.
double gigabytes_per_second(double bytes, double ms);

}  // namespace moe_ep_probe
