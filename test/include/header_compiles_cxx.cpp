// The public header compiles as C++17 with every warning an error.
#include "moe_ep_c.h"

// The core header does not pull in the MPI adapter's header; the adapter's
// header includes the core one and declares its functions after it.
#ifdef MOE_EP_MPI_H
#error "moe_ep_c.h must not include moe_ep_mpi.h"
#endif
#include <type_traits>

#include "moe_ep_mpi.h"
static_assert(std::is_same<decltype(&moe_ep_mpi_bootstrap_release), moe_ep_status_t (*)(moe_ep_bootstrap_t*)>::value,
              "moe_ep_mpi.h declares the MPI adapter");

int moe_ep_test_header_cxx() {
  moe_ep_params_t params{};
  params.struct_size = sizeof(params);
  return static_cast<int>(params.struct_size) + MOE_EP_SUCCESS;
}
