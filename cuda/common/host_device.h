// The one host/device marker of the kernels' tree: a small inline function
// that both the kernels and plain C++ (the host code, host tests) compile.
// In device code it is forced inline, as the kernels' own helpers are.
#pragma once

#if defined(__CUDACC__)
#define MOE_EP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MOE_EP_HOST_DEVICE inline
#endif
