#include "nccl/nccl_library.hpp"

#include <dlfcn.h>

#include <climits>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "common/tuning_registry.hpp"

namespace moe_ep {
namespace nccl {

namespace {

constexpr const char* kInstallHint =
    "; install NCCL (`pip install nvidia-nccl-cu13` or `nvidia-nccl-cu12`, the distro package libnccl2, or "
    "NVIDIA's CUDA repository) and put its lib/ directory on LD_LIBRARY_PATH, or set MOE_EP_NCCL_LIBRARY to "
    "the full path of libnccl.so.2";

template <typename Fn>
bool resolve(void* library, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out == nullptr && missing != nullptr) *missing += missing->empty() ? symbol : std::string(", ") + symbol;
  return *out != nullptr;
}

// Opens the library and resolves every entry point; NULL with *why otherwise.
std::unique_ptr<Api> open_library(const std::string& name, std::string* why) {
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* e = dlerror();
    *why = "NCCL could not be loaded: dlopen(\"" + name + "\") failed: " + (e ? e : "unknown error") + kInstallHint;
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  resolve(library, "ncclGetVersion", &api->GetVersion, &missing);
  resolve(library, "ncclGetUniqueId", &api->GetUniqueId, &missing);
  resolve(library, "ncclCommInitRankConfig", &api->CommInitRankConfig, &missing);
  resolve(library, "ncclCommInitRank", &api->CommInitRank, &missing);
  resolve(library, "ncclCommGetAsyncError", &api->CommGetAsyncError, &missing);
  resolve(library, "ncclCommDestroy", &api->CommDestroy, &missing);
  resolve(library, "ncclCommAbort", &api->CommAbort, &missing);
  resolve(library, "ncclSend", &api->Send, &missing);
  resolve(library, "ncclRecv", &api->Recv, &missing);
  resolve(library, "ncclGroupStart", &api->GroupStart, &missing);
  resolve(library, "ncclGroupEnd", &api->GroupEnd, &missing);
  resolve(library, "ncclGetErrorString", &api->GetErrorString, &missing);
  resolve(library, "ncclCommFinalize", &api->CommFinalize, nullptr);  // optional
  resolve(library, "ncclGetLastError", &api->GetLastError, nullptr);  // optional
  resolve(library, "ncclMemAlloc", &api->MemAlloc, nullptr);          // optional: registration
  resolve(library, "ncclMemFree", &api->MemFree, nullptr);
  resolve(library, "ncclCommRegister", &api->CommRegister, nullptr);
  resolve(library, "ncclCommDeregister", &api->CommDeregister, nullptr);
  if (!missing.empty()) {
    *why = "NCCL at \"" + name + "\" lacks " + missing + " (moe_ep needs NCCL 2.17 or newer)" + kInstallHint;
    dlclose(library);
    return nullptr;
  }
  if (api->GetVersion(&api->version_code) != kSuccess || api->version_code < 21700) {
    *why = "NCCL at \"" + name + "\" is version " + std::to_string(api->version_code) +
           "; moe_ep needs NCCL 2.17 or newer" + kInstallHint;
    dlclose(library);
    return nullptr;
  }
  Dl_info info{};
  api->path = dladdr(reinterpret_cast<void*>(api->GetVersion), &info) != 0 && info.dli_fname ? info.dli_fname : name;
  return api;  // the library stays loaded for the life of the process
}

std::mutex g_mutex;
// Every library loaded so far, by the name dlopen was given: a process may
// point MOE_EP_NCCL_LIBRARY elsewhere between creates.  Never unloaded.
std::map<std::string, std::unique_ptr<Api>> g_loaded;

}  // namespace

Config default_config(int blocking) {
  Config c{};
  c.size = sizeof(Config);
  c.magic = 0xcafebeef;
  c.version = 21700;  // NCCL_VERSION(2, 17, 0): the layout of Config
  c.blocking = blocking;
  c.cga_cluster_size = INT_MIN;  // NCCL_CONFIG_UNDEF_INT: NCCL's default
  c.min_ctas = INT_MIN;
  c.max_ctas = INT_MIN;
  c.net_name = nullptr;
  c.split_share = INT_MIN;
  return c;
}

std::string Api::version() const {
  return std::to_string(version_code / 10000) + "." + std::to_string(version_code / 100 % 100) + "." +
         std::to_string(version_code % 100);
}

std::string Api::describe(const char* call, Result result, CommHandle comm) const {
  std::string s = std::string(call) + " failed: " + GetErrorString(result) + " (NCCL " + version() + ")";
  if (GetLastError != nullptr) {
    const char* last = GetLastError(comm);
    if (last != nullptr && *last != '\0') s += ": " + std::string(last);
  }
  return s;
}

std::string library_name() { return knob_text(Knob::kNcclLibrary); }

const Api* load(std::string* why) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const std::string name = library_name();
  const auto found = g_loaded.find(name);
  if (found != g_loaded.end()) return found->second.get();
  std::string message;
  std::unique_ptr<Api> api = open_library(name, &message);
  if (!api) {
    if (why != nullptr) *why = message;
    return nullptr;
  }
  return (g_loaded[name] = std::move(api)).get();
}

}  // namespace nccl
}  // namespace moe_ep
