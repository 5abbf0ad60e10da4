// Launching the NVLink kernels, optionally with Programmatic Dependent Launch.
//
// With PDL (compute capability 9.0 and newer) a kernel may be scheduled while
// the kernel before it in the stream is still running: its launch latency
// (several microseconds, even in a graph) then overlaps the previous kernel's tail instead of
// following it.  Every kernel launched this way calls wait_for_prior_grid()
// before it touches memory that earlier work wrote (the caller's inputs, the
// control block, the combine_input view), which waits for the previous grid's
// completion and the visibility of its writes, exactly like an ordinary
// stream dependency.  Each kernel also calls allow_dependent_launch() once it
// has started, so that the next PDL-launched kernel (ours or the caller's) may
// be scheduled onto free SMs early; it still waits for this kernel to finish
// before reading anything.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

namespace moe_ep {
namespace kernels {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches `kernel` on `blocks` blocks of `threads` threads with
// `shared_bytes` of dynamic shared memory, with the programmatic stream
// serialisation attribute when `pdl` is nonzero.
template <typename Params>
cudaError_t launch_kernel(void (*kernel)(Params), int blocks, int threads, size_t shared_bytes, cudaStream_t stream,
                          int pdl, const Params& params) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl != 0 ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, params);
}

// Lets `kernel` launch with `bytes` of dynamic shared memory (above the
// default 48 KiB) on the current device.  Done once per device: the bits of
// `raised_on_devices` (one variable per kernel) say where it was; devices 64
// and above are raised on every call.
template <typename Params>
cudaError_t raise_dynamic_shared_limit_once(void (*kernel)(Params), size_t bytes,
                                            std::atomic<uint64_t>* raised_on_devices) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (raised_on_devices->load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e == cudaSuccess) raised_on_devices->fetch_or(bit, std::memory_order_release);
  return e;
}

}  // namespace kernels
}  // namespace moe_ep
