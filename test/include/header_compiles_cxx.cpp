// The public header compiles as C++17 with every warning an error.
#include "moe_ep_c.h"

// Compatibility: moe_ep_c.h alone still declares the MPI adapter (moe_ep_mpi.h).
#include <type_traits>
static_assert(std::is_same<decltype(&moe_ep_mpi_bootstrap_release),
                           moe_ep_status_t (*)(moe_ep_bootstrap_t*)>::value,
              "moe_ep_c.h must keep declaring the MPI adapter through moe_ep_mpi.h");

int moe_ep_test_header_cxx() {
  moe_ep_params_t params{};
  params.struct_size = sizeof(params);
  return static_cast<int>(params.struct_size) + MOE_EP_SUCCESS;
}
