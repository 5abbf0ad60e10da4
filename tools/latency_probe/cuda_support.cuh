// CUDA plumbing shared by the probe's measurements: checked calls and
// launches, owners of device memory, streams, events and graphs, and the
// device-side timers, memory operations and bounded spin.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "probe_measurements.hpp"

namespace moe_ep_probe {

// Throws ProbeError naming the call, the error and the place.
void check_cuda(cudaError_t status, const char* call, const char* file, int line);
#define PROBE_CUDA(call) ::moe_ep_probe::check_cuda((call), #call, __FILE__, __LINE__)

// Makes `device` current for the scope, then restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  template <class T>
  T* at(size_t offset_bytes) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset_bytes);
  }
  size_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  int device_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// A non-blocking stream (no implicit order with the legacy default stream, so
// that the two sides' kernels on one GPU run at the same time).
class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// An instantiated graph (and the graph it came from).
class GraphExec {
 public:
  GraphExec() = default;
  GraphExec(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}
  ~GraphExec();
  GraphExec(GraphExec&& other) noexcept
      : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
  GraphExec& operator=(GraphExec&& other) noexcept {
    std::swap(graph_, other.graph_);
    std::swap(exec_, other.exec_);
    return *this;
  }
  cudaGraphExec_t get() const { return exec_; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Launches `kernel` (blocks x threads) on `stream`, checked; with
// `programmatic` the launch may overlap the previous kernel in the stream
// (Programmatic Dependent Launch), which then must call
// cudaGridDependencySynchronize() before it reads that kernel's results.
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), unsigned blocks, unsigned threads, cudaStream_t stream, bool programmatic,
            Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  if (programmatic) {
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  PROBE_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// Captures what `enqueue(stream)` queues on a capturing stream of `device`
// into a graph and instantiates it; a failure (the runtime refused a node)
// leaves no capture open and throws.
template <class Enqueue>
GraphExec capture_graph(int device, Enqueue enqueue) {
  DeviceScope scope(device);
  Stream capture(device);
  PROBE_CUDA(cudaStreamBeginCapture(capture.get(), cudaStreamCaptureModeThreadLocal));
  try {
    enqueue(capture.get());
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(capture.get(), &broken);
    if (broken != nullptr) cudaGraphDestroy(broken);
    cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  PROBE_CUDA(cudaStreamEndCapture(capture.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  if (status != cudaSuccess) cudaGraphDestroy(graph);
  PROBE_CUDA(status);
  return GraphExec(graph, exec);
}

// Microseconds from SM cycles, with the ratio a kernel measured itself
// (global-timer ns over clock64 cycles across its whole run).
inline double cycles_to_us(long long cycles, double ns_per_cycle) { return double(cycles) * ns_per_cycle / 1000.0; }

// ---- device side ----------------------------------------------------------

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

// SM cycles; the memory clobber keeps it in place between the timed operations.
__device__ __forceinline__ long long cycles_now() {
  long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ void store_relaxed_sys(unsigned* p, unsigned v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void store_release_sys(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void add_relaxed_sys(unsigned* p, unsigned v) {
  asm volatile("red.relaxed.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire_sys(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long load_relaxed_sys(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// 16 bytes as two 8-byte elements: each element is one single-copy-atomic
// access, so a reader sees each 8-byte half whole (not the pair together).
__device__ __forceinline__ void store_relaxed_sys_v2(ulonglong2* p, ulonglong2 v) {
  asm volatile("st.relaxed.sys.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(v.x), "l"(v.y) : "memory");
}

__device__ __forceinline__ ulonglong2 load_relaxed_sys_v2(const ulonglong2* p) {
  ulonglong2 v;
  asm volatile("ld.relaxed.sys.global.v2.u64 {%0, %1}, [%2];" : "=l"(v.x), "=l"(v.y) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// Calls done() until it returns true; false once timeout_ns have passed.  The
// global timer is read only every 256 polls, the first time to set the
// deadline, so a wait that ends quickly pays nothing for its bound.
template <class Done>
__device__ __forceinline__ bool spin_until(Done done, uint64_t timeout_ns) {
  uint64_t deadline = 0;
  for (unsigned polls = 1;; ++polls) {
    if (done()) return true;
    if ((polls & 255u) == 0) {
      const uint64_t now = global_ns();
      if (deadline == 0) {
        deadline = now + timeout_ns;
      } else if (now > deadline) {
        return false;
      }
    }
  }
}

}  // namespace moe_ep_probe
