#include "backend_table.hpp"

#include <utility>
#include <vector>

#include "collective_step.hpp"
#include "common/cuda_driver_probe.hpp"
#include "common/host_identity.hpp"
#include "common/log.hpp"
#include "error.hpp"
#include "host_backend.hpp"
#include "nccl/nccl_backend.hpp"
#include "nvlink/nvlink_backend.hpp"

namespace moe_ep {

// Unreachable: the handle refuses the split calls on a backend without them.
void Backend::dispatch_send(int32_t /*slot*/, const DispatchCall& /*call*/, void* /*stream*/) {
  fail(MOE_EP_ERROR_INTERNAL, "the ", name(), " backend has no split phases (dispatch_send)");
}
DispatchBuffers Backend::dispatch_recv(int32_t /*slot*/, void* /*stream*/) {
  fail(MOE_EP_ERROR_INTERNAL, "the ", name(), " backend has no split phases (dispatch_recv)");
}
void Backend::combine_send(int32_t /*slot*/, const CombineCall& /*call*/, void* /*stream*/) {
  fail(MOE_EP_ERROR_INTERNAL, "the ", name(), " backend has no split phases (combine_send)");
}
void* Backend::combine_recv(int32_t /*slot*/, void* /*output*/, void* /*stream*/) {
  fail(MOE_EP_ERROR_INTERNAL, "the ", name(), " backend has no split phases (combine_recv)");
}

namespace {

const BackendEntry kNvlink{
    MOE_EP_BACKEND_NVLINK_TWO_SIDED,
    "NVLINK_TWO_SIDED",
    [](int32_t device, std::string* why) {
      const bool supported = nvlink_platform_supported(device);
      if (!supported && why != nullptr) *why = cuda_driver_missing();
      if (!supported && why != nullptr && why->empty()) *why = "no GPU, or no GPU backend in this build";
      return supported;
    },
    [](const Layout& layout, const moe_ep_config_t& config) { return nvlink_workspace_bytes(layout, config); },
    [](const Layout& layout, const moe_ep_config_t& config, const Bootstrap& bootstrap,
       std::shared_ptr<BoundedExchange> exchange) {
      exchange.reset();  // idle: its worker is joined; the NVLink backend bounds its own waits
      return make_nvlink_backend(layout, config, bootstrap);
    },
    kMaxMicroBatches,
    /*expert_layouts=*/true,
    /*fp8_dispatch_wire=*/true,
    /*fp8_combine_wire=*/true,
};

const BackendEntry kNccl{
    MOE_EP_BACKEND_NCCL,
    "NCCL",
    [](int32_t device, std::string* why) { return nccl_platform_supported(device, why); },
    [](const Layout& layout, const moe_ep_config_t& config) {
      return nccl_workspace_bytes(layout, config.micro_batches);
    },
    [](const Layout& layout, const moe_ep_config_t& config, const Bootstrap& bootstrap,
       std::shared_ptr<BoundedExchange> exchange) {
      exchange.reset();  // idle: its worker is joined; the NCCL backend bounds its own waits
      return make_nccl_backend(layout, config, bootstrap);
    },
    kMaxMicroBatches,
    /*expert_layouts=*/true,
    /*fp8_dispatch_wire=*/true,
    /*fp8_combine_wire=*/true,
};

const BackendEntry kHost{
    MOE_EP_BACKEND_HOST,
    "HOST",
    [](int32_t /*device*/, std::string* /*why*/) { return true; },
    [](const Layout& layout, const moe_ep_config_t& config) {
      return host_workspace_bytes(layout, config.micro_batches);
    },
    // Builds the HOST backend and agrees on the outcome: an allocation that fails
    // on one rank fails create on every rank instead of leaving the others to wait.
    [](const Layout& layout, const moe_ep_config_t& config, const Bootstrap& /*bootstrap*/,
       std::shared_ptr<BoundedExchange> exchange) {
      std::unique_ptr<Backend> backend;
      run_then_agree(*exchange, [&] { backend = make_host_backend(layout, config.micro_batches, exchange); });
      return backend;
    },
    kMaxMicroBatches,
    /*expert_layouts=*/true,
    /*fp8_dispatch_wire=*/true,
    /*fp8_combine_wire=*/true,
};

// What one rank can run, for AUTO: the NVLink backend, NCCL, and where it is.
struct BackendView {
  int32_t local_choice;  // resolve_backend_locally's answer
  int32_t nccl_usable;
  HostIdentity host;
};

}  // namespace

const BackendEntry& backend_entry(int32_t id) {
  switch (id) {
    case MOE_EP_BACKEND_NVLINK_TWO_SIDED: return kNvlink;
    case MOE_EP_BACKEND_NCCL: return kNccl;
    case MOE_EP_BACKEND_HOST: return kHost;
    default: fail(MOE_EP_ERROR_INTERNAL, "backend table: no entry for backend ", id);
  }
}

namespace {
const char* layout_name(int32_t layout) {
  switch (layout) {
    case MOE_EP_LAYOUT_RANK_MAJOR: return "MOE_EP_LAYOUT_RANK_MAJOR";
    case MOE_EP_LAYOUT_EXPERT_MAJOR: return "MOE_EP_LAYOUT_EXPERT_MAJOR";
    case MOE_EP_LAYOUT_EXPERT_PACKED: return "MOE_EP_LAYOUT_EXPERT_PACKED";
    default: return "an unknown layout";
  }
}
}  // namespace

void check_backend_capabilities(int32_t backend, const Layout& layout, int32_t micro_batches) {
  const BackendEntry& entry = backend_entry(backend);
  if (micro_batches > entry.max_micro_batches) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->micro_batches: expected at most ", entry.max_micro_batches, " on the ",
         entry.name, " backend, got ", micro_batches);
  }
  if (layout.expert_layout() && !entry.expert_layouts) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "params->receive_layout: the ", entry.name,
         " backend lays the received rows out in MOE_EP_LAYOUT_RANK_MAJOR only, got ",
         layout_name(layout.receive_layout), " (", layout.receive_layout, "); the HOST backend has every layout");
  }
  const auto check_wire = [&](const char* field, int32_t wire, bool has_fp8) {
    if (wire != MOE_EP_WIRE_AS_IS && !has_fp8) {
      fail(MOE_EP_ERROR_UNSUPPORTED, field, ": the ", entry.name,
           " backend moves these rows in MOE_EP_WIRE_AS_IS (0) only, got MOE_EP_WIRE_FP8_E4M3_BLOCK128 (", wire, ")",
           "; the HOST backend has every wire format");
    }
  };
  check_wire("params->dispatch_wire", layout.dispatch_wire, entry.fp8_dispatch_wire);
  check_wire("params->combine_wire", layout.combine_wire, entry.fp8_combine_wire);
}

int32_t resolve_backend_locally(const moe_ep_config_t& config) {
  if (config.backend == MOE_EP_BACKEND_HOST) return MOE_EP_BACKEND_HOST;
  if (config.backend == MOE_EP_BACKEND_NCCL) {
    std::string why;
    if (!kNccl.platform_supported(config.device, &why)) {
      fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NCCL is not usable on device ", config.device,
           " of this process: ", why);
    }
    return MOE_EP_BACKEND_NCCL;
  }
  std::string why;
  const bool supported = kNvlink.platform_supported(config.device, &why);
  if (config.backend == MOE_EP_BACKEND_NVLINK_TWO_SIDED && !supported) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on device ", config.device,
         " of this process (", why, ")");
  }
  if (supported) return MOE_EP_BACKEND_NVLINK_TWO_SIDED;
  return kNccl.platform_supported(config.device, nullptr) ? MOE_EP_BACKEND_NCCL : MOE_EP_BACKEND_HOST;
}

int32_t agree_on_backend(const Exchange& exchange, int32_t asked, const moe_ep_config_t& config) {
  BackendView mine{};
  mine.local_choice = config.backend;
  mine.nccl_usable = asked == MOE_EP_BACKEND_AUTO && config.backend != MOE_EP_BACKEND_HOST &&
                     (config.backend == MOE_EP_BACKEND_NCCL || kNccl.platform_supported(config.device, nullptr));
  mine.host = local_host_identity();
  const std::vector<BackendView> all = exchange.allgather_value(mine, "create: backend choice");
  bool all_nvlink = true, all_nccl = true, one_host = true;
  for (const BackendView& v : all) {
    all_nvlink = all_nvlink && v.local_choice == MOE_EP_BACKEND_NVLINK_TWO_SIDED;
    all_nccl = all_nccl && v.nccl_usable != 0;
    one_host = one_host && same_host(v.host, all[0].host);
  }
  if (asked == MOE_EP_BACKEND_NVLINK_TWO_SIDED && !all_nvlink) {
    fail(MOE_EP_ERROR_UNSUPPORTED, "config->backend: NVLINK_TWO_SIDED is not supported on every rank");
  }
  if (asked != MOE_EP_BACKEND_AUTO) return config.backend;
  const int32_t chosen = all_nvlink && one_host ? MOE_EP_BACKEND_NVLINK_TWO_SIDED
                         : all_nccl             ? MOE_EP_BACKEND_NCCL
                                                : MOE_EP_BACKEND_HOST;
  log_info("rank ", exchange.rank(), ": backend AUTO chose ", backend_entry(chosen).name,
           " (every rank NVLink-capable: ", all_nvlink ? "yes" : "no", ", one host: ", one_host ? "yes" : "no",
           ", NCCL usable on every rank: ", all_nccl ? "yes" : "no", ")");
  return chosen;
}

}  // namespace moe_ep
