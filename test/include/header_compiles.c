/* The public headers compile as strict C (C99 and C11, -Wall -Wextra -Werror
 * -pedantic) and their types are usable from C.  moe_ep_mpi.h comes first: it
 * must stand alone (it includes moe_ep_c.h). */
#include "moe_ep_mpi.h"
#include "moe_ep_c.h"

/* One symbol per standard: moe_ep_test_header_c99, moe_ep_test_header_c11. */
#define MOE_EP_CAT2(a, b) a##b
#define MOE_EP_CAT(a, b) MOE_EP_CAT2(a, b)
#define MOE_EP_TEST_FN MOE_EP_CAT(moe_ep_test_header_c, MOE_EP_TEST_C_STD)

int MOE_EP_TEST_FN(void);
int MOE_EP_TEST_FN(void) {
  moe_ep_params_t params;
  moe_ep_config_t config;
  moe_ep_tensor_t tensor;
  moe_ep_handle_t handle = NULL;
  tensor.ndim = 0;
  params.struct_size = (uint32_t)sizeof(params);
  config.struct_size = (uint32_t)sizeof(config);
  (void)handle;
  /* Unevaluated: the adapter's prototypes are visible, nothing is linked. */
  (void)sizeof(moe_ep_mpi_bootstrap_init((const void*)0, (moe_ep_bootstrap_t*)0, sizeof(moe_ep_bootstrap_t)));
  return (int)(params.struct_size + config.struct_size) + tensor.ndim + MOE_EP_SUCCESS;
}
