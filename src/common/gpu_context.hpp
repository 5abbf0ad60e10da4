// The CUDA context of the thread that calls moe_ep, carried to the thread that
// runs the bootstrap callbacks (bounded_exchange.cpp).  Why: callbacks may use
// the GPU (a torch.distributed NCCL group gathers through CUDA tensors), and a
// CUDA context is current per thread; on a fresh thread every rank would find
// device 0, and NCCL then refuses "two ranks on one GPU".  Only a context that
// is already current is carried: nothing is created, so a HOST-only process
// never touches a GPU.
#pragma once

namespace moe_ep {

// The calling thread's current CUDA context (a CUcontext), or NULL when there
// is none, no driver, or no GPU support in this build.  Never fails.
void* current_gpu_context() noexcept;

// Makes `context` current on the calling thread; NULL is a no-op.  Never fails
// (a failure leaves the thread without a context, as it was).
void make_gpu_context_current(void* context) noexcept;

}  // namespace moe_ep
