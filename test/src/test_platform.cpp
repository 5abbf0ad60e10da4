// moe_ep_is_platform_supported: local, never fails for lack of a GPU, and
// says 0 where there is no CUDA driver (the CPU-only CI machine).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <string>

#include "case_skip.hpp"
#include "common/cuda_driver_probe.hpp"
#include "moe_ep_c.h"
#include "test_params.hpp"
#include "thread_bootstrap.hpp"

using Catch::Matchers::Contains;

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

TEST_CASE("AUTO falls back to HOST where the NVLink backend is unsupported", "[platform][no_gpu]") {
  int32_t supported = 0;
  REQUIRE(moe_ep_is_platform_supported(-1, &supported) == MOE_EP_SUCCESS);
  if (supported) {
    moe_ep_test::skip_case("AUTO picks NVLink here; covered by the GPU tests");
    return;
  }
  const moe_ep_params_t p = moe_ep_test::make_params(2, 1, 2, 4);
  uint64_t auto_bytes = 0, host_bytes = 0;
  REQUIRE(moe_ep_workspace_size(&p, nullptr, 1, &auto_bytes) == MOE_EP_SUCCESS);
  const moe_ep_config_t c = moe_ep_test::host_config();
  REQUIRE(moe_ep_workspace_size(&p, &c, 1, &host_bytes) == MOE_EP_SUCCESS);
  CHECK(auto_bytes == host_bytes);
}

// Where libcuda.so.1 does not load there is no driver, and the messages say
// so instead of the runtime's "CUDA driver version is insufficient"; where it
// loads, they say the driver is too old.  Each machine checks its own branch.
TEST_CASE("no CUDA driver is reported as such, not as an old driver", "[platform]") {
  CHECK(moe_ep::cuda_version_text(12080) == "CUDA 12.8");
  CHECK(moe_ep::cuda_version_text(11040) == "CUDA 11.4");
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (driver != nullptr) {
    dlclose(driver);
    CHECK(moe_ep::cuda_driver_missing().empty());
    const std::string old = moe_ep::describe_insufficient_driver(12020, 12080);
    CHECK_THAT(old, Contains("older than the CUDA runtime") && Contains("CUDA 12.2") && Contains("CUDA 12.8"));
    return;
  }
  // A driverless machine (the CPU-only CI machine).
  const std::string missing = moe_ep::cuda_driver_missing();
  CHECK_THAT(missing, Contains("no CUDA driver found") && Contains("libcuda.so.1") && Contains("MOE_EP_BACKEND_HOST"));
  CHECK(moe_ep::describe_insufficient_driver(0, 12080) == missing);
  CHECK_THAT(moe_ep::describe_insufficient_driver(0, 12080), !Contains("insufficient") && !Contains("older"));

  // What a user sees asking for the NVLink backend here.
  const moe_ep_bootstrap_t b = moe_ep_test::single_rank_bootstrap();
  const moe_ep_params_t p = moe_ep_test::make_params(2, 1, 2, 4);
  moe_ep_config_t c;
  REQUIRE(moe_ep_config_init(&c, sizeof c) == MOE_EP_SUCCESS);
  c.backend = MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  moe_ep_handle_t h = nullptr;
  CHECK(moe_ep_create(&b, &p, &c, &h) == MOE_EP_ERROR_UNSUPPORTED);
  CHECK(h == nullptr);
  const std::string message = moe_ep_last_error();
  INFO(message);
  CHECK_THAT(message, Contains("NVLINK_TWO_SIDED") && Contains("no CUDA driver found") && !Contains("insufficient"));
}
