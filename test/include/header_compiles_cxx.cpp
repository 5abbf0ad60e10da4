// The public header compiles as C++17 with every warning an error.
#include "moe_ep_c.h"

int moe_ep_test_header_cxx() {
  moe_ep_params_t params{};
  params.struct_size = sizeof(params);
  return static_cast<int>(params.struct_size) + MOE_EP_SUCCESS;
}
