// moe_ep_is_platform_supported: local, never fails for lack of a GPU, and
// says 0 where there is no CUDA driver (the CPU-only CI machine).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include "moe_ep_c.h"
#include "test_params.hpp"

TEST_CASE("is_platform_supported answers SUCCESS, and 0 without a driver", "[platform]") {
  int32_t supported = -1;
  REQUIRE(moe_ep_is_platform_supported(0, &supported) == MOE_EP_SUCCESS);
  CHECK((supported == 0 || supported == 1));
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver == nullptr) {
    CHECK(supported == 0);
  } else {
    dlclose(driver);
  }
  REQUIRE(moe_ep_is_platform_supported(-1, &supported) == MOE_EP_SUCCESS);
  if (driver == nullptr) CHECK(supported == 0);
  CHECK(moe_ep_is_platform_supported(0, nullptr) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(moe_ep_is_platform_supported(-2, &supported) == MOE_EP_ERROR_INVALID_ARGUMENT);
  CHECK(supported == 0);
}

TEST_CASE("AUTO falls back to HOST where the NVLink backend is unsupported", "[platform]") {
  int32_t supported = 0;
  REQUIRE(moe_ep_is_platform_supported(-1, &supported) == MOE_EP_SUCCESS);
  if (supported) return;  // AUTO picks NVLink there; covered by the GPU tests
  const moe_ep_params_t p = moe_ep_test::make_params(2, 1, 2, 4);
  uint64_t auto_bytes = 0, host_bytes = 0;
  REQUIRE(moe_ep_workspace_size(&p, nullptr, 1, &auto_bytes) == MOE_EP_SUCCESS);
  const moe_ep_config_t c = moe_ep_test::host_config();
  REQUIRE(moe_ep_workspace_size(&p, &c, 1, &host_bytes) == MOE_EP_SUCCESS);
  CHECK(auto_bytes == host_bytes);
}
