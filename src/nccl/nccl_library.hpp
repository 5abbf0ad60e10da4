// NCCL reached at run time: dlopen("libnccl.so.2") (or the file named by
// MOE_EP_NCCL_LIBRARY) and the handful of entry points moe_ep uses, declared
// here with minimal types so that neither nccl.h nor libnccl is needed to
// build or to load libmoe_ep.  Shared by the NCCL backend and the
// conformance tool's NCCL baseline (one loader, compiled into both).
#pragma once

#include <cstddef>
#include <string>

namespace moe_ep {
namespace nccl {

// The subset of NCCL's C types this project uses, laid out as NCCL defines
// them (stable across NCCL 2.x).
using Result = int;  // ncclResult_t
constexpr Result kSuccess = 0;
constexpr Result kInvalidUsage = 5;
constexpr Result kInProgress = 7;
// Not an NCCL code: what moe_ep reports for a communicator it aborted.
constexpr Result kRemoteAborted = 6;  // ncclRemoteError

using DataType = int;  // ncclDataType_t
constexpr DataType kInt8 = 0;
constexpr DataType kInt32 = 2;

struct Comm;  // opaque ncclComm
using CommHandle = Comm*;

struct UniqueId {
  char internal[128];
};

// The first fields of ncclConfig_t, as NCCL 2.17 defined it.  NCCL reads a
// config by its size and version fields, so newer libraries accept it.
struct Config {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
  int min_ctas;
  int max_ctas;
  const char* net_name;
  int split_share;
};
// NCCL_CONFIG_INITIALIZER for Config, with blocking as given (0 = calls may
// return kInProgress and the caller polls CommGetAsyncError).
Config default_config(int blocking);

struct Api {
  Result (*GetVersion)(int* version);
  Result (*GetUniqueId)(UniqueId* id);
  Result (*CommInitRankConfig)(CommHandle* comm, int nranks, UniqueId id, int rank, Config* config);
  Result (*CommInitRank)(CommHandle* comm, int nranks, UniqueId id, int rank);
  Result (*CommGetAsyncError)(CommHandle comm, Result* async_error);
  Result (*CommFinalize)(CommHandle comm);  // NULL before NCCL 2.14
  Result (*CommDestroy)(CommHandle comm);
  Result (*CommAbort)(CommHandle comm);
  Result (*Send)(const void* buffer, size_t count, DataType type, int peer, CommHandle comm, void* stream);
  Result (*Recv)(void* buffer, size_t count, DataType type, int peer, CommHandle comm, void* stream);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  const char* (*GetErrorString)(Result result);
  const char* (*GetLastError)(CommHandle comm);  // NULL before NCCL 2.13
  // User-buffer registration (NCCL 2.19 and newer; NULL before): memory from
  // MemAlloc, registered with CommRegister, lets NCCL's send/recv over NVLink
  // copy straight between the two ranks' buffers (docs/nccl_backend.md).
  Result (*MemAlloc)(void** pointer, size_t bytes);
  Result (*MemFree)(void* pointer);
  Result (*CommRegister)(CommHandle comm, void* buffer, size_t bytes, void** handle);
  Result (*CommDeregister)(CommHandle comm, void* handle);
  bool can_register() const {
    return MemAlloc != nullptr && MemFree != nullptr && CommRegister != nullptr && CommDeregister != nullptr;
  }

  std::string path;  // the file that was loaded
  int version_code = 0;  // X*10000 + Y*100 + Z
  std::string version() const;  // "2.28.9"
  // "ncclSend: unhandled cuda error (...)" with NCCL's last error text.
  std::string describe(const char* call, Result result, CommHandle comm) const;
};

// The process-wide NCCL, loaded on first use; NULL where it cannot be loaded,
// with *why naming the path tried, the loader's message and how to install
// NCCL.  Thread safe; never throws.  MOE_EP_NCCL_LIBRARY is read at every
// call; a library once loaded stays loaded, a failed load is retried.
const Api* load(std::string* why);

// The name dlopen is given: MOE_EP_NCCL_LIBRARY if set and not empty, else "libnccl.so.2".
std::string library_name();

}  // namespace nccl
}  // namespace moe_ep
