// Host-side facts about the compiled kernels.
#include "common/fast_division.h"
#include "moe_ep_kernels.h"

namespace moe_ep {
namespace kernels {

void division_magic(uint32_t divisor, uint32_t* magic, uint32_t* shift) {
  compute_division_magic(divisor, magic, shift);
}

int32_t lowest_compiled_arch() {
  // nvcc lists the virtual architectures of this compilation, e.g. 900,1000.
  constexpr int kArchs[] = {__CUDA_ARCH_LIST__};
  int lowest = kArchs[0];
  for (int a : kArchs) lowest = a < lowest ? a : lowest;
  return lowest / 10;
}

}  // namespace kernels
}  // namespace moe_ep
