// The C shim: every exported function.  Each body runs inside guarded(), which
// maps C++ exceptions to a status and the thread-local message, so that no
// exception ever crosses the ABI.
#include <string>

#include "common/call_path.hpp"
#include "error.hpp"
#include "handle.hpp"
#include "moe_ep_c.h"
#include "params.hpp"
#include "store/store_bootstrap.hpp"
#include "store/store_server.hpp"
#include "versioned_struct.hpp"

struct moe_ep_store_s {
  moe_ep::store::StoreServer server;
  moe_ep_store_s(const std::string& host, int32_t port) : server(host, port) {}
};

namespace {

template <typename Body>
moe_ep_status_t guarded(Body&& body) noexcept {
  moe_ep::clear_last_error();
  try {
    body();
    return MOE_EP_SUCCESS;
  } catch (...) {
    std::string message;
    const moe_ep_status_t status = moe_ep::status_of_current_exception(&message);
    moe_ep::set_last_error(message);
    return status;
  }
}

template <typename T>
void require_out(T* p, const char* name) {
  if (p == nullptr) moe_ep::fail_argument(name, "a non-NULL pointer", "NULL");
}

void require_handle(moe_ep_handle_t h) {
  if (h == nullptr) moe_ep::fail_argument("handle", "a handle from moe_ep_create", "NULL");
}

}  // namespace

extern "C" {

const char* moe_ep_status_string(moe_ep_status_t status) { return moe_ep::status_name(status); }

const char* moe_ep_last_error(void) { return moe_ep::last_error(); }

moe_ep_status_t moe_ep_set_last_error(const char* message) {
  if (message == nullptr) {
    moe_ep::clear_last_error();
  } else {
    moe_ep::set_last_error(message);
  }
  return MOE_EP_SUCCESS;
}

moe_ep_status_t moe_ep_get_version(int32_t* major, int32_t* minor, int32_t* patch) {
  return guarded([&] {
    if (major) *major = MOE_EP_VERSION_MAJOR;
    if (minor) *minor = MOE_EP_VERSION_MINOR;
    if (patch) *patch = MOE_EP_VERSION_PATCH;
  });
}

moe_ep_status_t moe_ep_bootstrap_init(moe_ep_bootstrap_t* b, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(b, struct_size, moe_ep_bootstrap_t{}, "bootstrap"); });
}

moe_ep_status_t moe_ep_params_init(moe_ep_params_t* p, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(p, struct_size, moe_ep::default_params(), "params"); });
}

moe_ep_status_t moe_ep_config_init(moe_ep_config_t* c, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(c, struct_size, moe_ep::default_config(), "config"); });
}

moe_ep_status_t moe_ep_dispatch_args_init(moe_ep_dispatch_args_t* a, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(a, struct_size, moe_ep_dispatch_args_t{}, "args"); });
}

moe_ep_status_t moe_ep_dispatch_result_init(moe_ep_dispatch_result_t* r, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(r, struct_size, moe_ep_dispatch_result_t{}, "result"); });
}

moe_ep_status_t moe_ep_combine_result_init(moe_ep_combine_result_t* r, size_t struct_size) {
  return guarded([&] { moe_ep::init_versioned(r, struct_size, moe_ep_combine_result_t{}, "result"); });
}

moe_ep_status_t moe_ep_is_platform_supported(int32_t device, int32_t* supported) {
  return guarded([&] {
    require_out(supported, "supported");
    *supported = 0;
    if (device < -1) moe_ep::fail_argument("device", ">= -1 (-1 = current device)", device);
    *supported = moe_ep::is_platform_supported(device) ? 1 : 0;
  });
}

moe_ep_status_t moe_ep_workspace_size(const moe_ep_params_t* params, const moe_ep_config_t* config,
                                      int32_t world_size, uint64_t* bytes) {
  return guarded([&] {
    require_out(bytes, "bytes");
    *bytes = 0;
    *bytes = moe_ep::workspace_size(params, config, world_size);
  });
}

moe_ep_status_t moe_ep_create(const moe_ep_bootstrap_t* bootstrap, const moe_ep_params_t* params,
                              const moe_ep_config_t* config, moe_ep_handle_t* handle) {
  if (handle != nullptr) *handle = nullptr;
  return guarded([&] {
    require_out(handle, "handle");
    *handle = moe_ep::create_handle(bootstrap, params, config);
  });
}

moe_ep_status_t moe_ep_dispatch(moe_ep_handle_t handle, const moe_ep_dispatch_args_t* args,
                                moe_ep_dispatch_result_t* result, void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::dispatch(*handle, args, result, stream);
  });
}

moe_ep_status_t moe_ep_combine(moe_ep_handle_t handle, const moe_ep_tensor_t* expert_output,
                               const moe_ep_tensor_t* output, moe_ep_combine_result_t* result,
                               void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::combine(*handle, expert_output, output, result, stream);
  });
}

moe_ep_status_t moe_ep_dispatch_send(moe_ep_handle_t handle, int32_t slot, const moe_ep_dispatch_args_t* args,
                                     void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::dispatch_send(*handle, slot, args, stream);
  });
}

moe_ep_status_t moe_ep_dispatch_recv(moe_ep_handle_t handle, int32_t slot, moe_ep_dispatch_result_t* result,
                                     void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::dispatch_recv(*handle, slot, result, stream);
  });
}

moe_ep_status_t moe_ep_combine_send(moe_ep_handle_t handle, int32_t slot, const moe_ep_tensor_t* expert_output,
                                    void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::combine_send(*handle, slot, expert_output, stream);
  });
}

moe_ep_status_t moe_ep_combine_recv(moe_ep_handle_t handle, int32_t slot, const moe_ep_tensor_t* output,
                                    moe_ep_combine_result_t* result, void* stream) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::combine_recv(*handle, slot, output, result, stream);
  });
}

moe_ep_status_t moe_ep_get_backend(moe_ep_handle_t handle, int32_t* backend) {
  return guarded([&] {
    require_handle(handle);
    require_out(backend, "backend");
    *backend = moe_ep::backend_of(*handle);
  });
}

moe_ep_status_t moe_ep_get_last_path(moe_ep_handle_t handle, int32_t phase, int32_t* path) {
  return guarded([&] {
    require_handle(handle);
    if (phase != MOE_EP_PHASE_DISPATCH && phase != MOE_EP_PHASE_COMBINE) {
      moe_ep::fail_argument("phase", "MOE_EP_PHASE_DISPATCH (0) or MOE_EP_PHASE_COMBINE (1)", phase);
    }
    require_out(path, "path");
    *path = moe_ep::last_path_of(*handle, phase);
  });
}

const char* moe_ep_path_name(int32_t path) { return moe_ep::path_name(path); }

moe_ep_status_t moe_ep_get_async_error(moe_ep_handle_t handle, moe_ep_status_t* status) {
  moe_ep_status_t found = MOE_EP_SUCCESS;
  std::string message;
  const moe_ep_status_t rc = guarded([&] {
    require_handle(handle);
    require_out(status, "status");
    found = moe_ep::poll_async_error(*handle);
    message = moe_ep::last_error();
  });
  if (rc == MOE_EP_SUCCESS) {
    *status = found;
    moe_ep::set_last_error(message);  // the async error's message, readable after the call
  }
  return rc;
}

moe_ep_status_t moe_ep_health_init(moe_ep_health_t* health, size_t struct_size) {
  moe_ep_health_t defaults{};
  defaults.struct_size = sizeof(defaults);
  defaults.failed_rank = -1;
  return guarded([&] { moe_ep::init_versioned(health, struct_size, defaults, "health"); });
}

moe_ep_status_t moe_ep_poll_health(moe_ep_handle_t handle, moe_ep_health_t* health) {
  std::string message;
  const moe_ep_status_t rc = guarded([&] {
    require_handle(handle);
    require_out(health, "health");
    moe_ep::check_output_struct(health, "health");
    const moe_ep_health_t found = moe_ep::poll_health(*handle);
    message = moe_ep::last_error();
    moe_ep::write_versioned(health, found, "health");
  });
  if (rc == MOE_EP_SUCCESS) moe_ep::set_last_error(message);  // the failure's message, readable after the call
  return rc;
}

moe_ep_status_t moe_ep_get_active_ranks(moe_ep_handle_t handle, uint8_t* active, int32_t world_size) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::get_active_ranks(*handle, active, world_size);
  });
}

moe_ep_status_t moe_ep_set_active_ranks(moe_ep_handle_t handle, const uint8_t* active, int32_t world_size) {
  return guarded([&] {
    require_handle(handle);
    moe_ep::set_active_ranks(*handle, active, world_size);
  });
}

moe_ep_status_t moe_ep_store_serve(const char* host, int32_t port, moe_ep_store_t* store) {
  if (store != nullptr) *store = nullptr;
  return guarded([&] {
    require_out(store, "store");
    *store = new moe_ep_store_s(host ? host : "", port);
  });
}

moe_ep_status_t moe_ep_store_port(moe_ep_store_t store, int32_t* port) {
  return guarded([&] {
    if (store == nullptr) moe_ep::fail_argument("store", "a store from moe_ep_store_serve", "NULL");
    require_out(port, "port");
    *port = store->server.port();
  });
}

moe_ep_status_t moe_ep_store_destroy(moe_ep_store_t* store) {
  return guarded([&] {
    if (store == nullptr || *store == nullptr) return;
    moe_ep_store_t s = *store;
    *store = nullptr;
    delete s;
  });
}

moe_ep_status_t moe_ep_bootstrap_from_store(const char* address, const char* prefix, int32_t rank, int32_t world_size,
                                            int32_t timeout_ms, moe_ep_bootstrap_t* bootstrap) {
  return guarded([&] {
    require_out(bootstrap, "bootstrap");
    if (address == nullptr) moe_ep::fail_argument("address", "\"host:port\" of a store", "NULL");
    if (prefix == nullptr) moe_ep::fail_argument("prefix", "a name unique per group", "NULL");
    moe_ep::check_output_struct(bootstrap, "bootstrap");
    moe_ep_bootstrap_t made = moe_ep::make_store_bootstrap(address, prefix, rank, world_size, timeout_ms);
    if (bootstrap->struct_size < sizeof(moe_ep_bootstrap_t)) {
      moe_ep::release_store_bootstrap(&made);
      moe_ep::fail_argument("bootstrap->struct_size",
                            ">= " + std::to_string(sizeof(moe_ep_bootstrap_t)) + " (every field is filled)",
                            bootstrap->struct_size);
    }
    moe_ep::write_versioned(bootstrap, made, "bootstrap");
  });
}

moe_ep_status_t moe_ep_bootstrap_release(moe_ep_bootstrap_t* bootstrap) {
  return guarded([&] {
    require_out(bootstrap, "bootstrap");
    if (!moe_ep::release_store_bootstrap(bootstrap)) {
      moe_ep::fail_argument("bootstrap", "one filled by moe_ep_bootstrap_from_store", "other callbacks");
    }
  });
}

moe_ep_status_t moe_ep_destroy(moe_ep_handle_t* handle) {
  return guarded([&] {
    if (handle == nullptr || *handle == nullptr) return;  // idempotent
    moe_ep_handle_t h = *handle;
    *handle = nullptr;
    moe_ep::destroy_handle(h);
  });
}

}  // extern "C"
