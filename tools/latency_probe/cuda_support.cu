#include "cuda_support.cuh"

#include <string>

namespace moe_ep_probe {

void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so that later measurements can still run
  throw ProbeError(std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                   ") at " + file + ":" + std::to_string(line));
}

DeviceScope::DeviceScope(int device) {
  PROBE_CUDA(cudaGetDevice(&previous_));
  PROBE_CUDA(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() { cudaSetDevice(previous_); }

DeviceBuffer::DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
  DeviceScope scope(device);
  PROBE_CUDA(cudaMalloc(&ptr_, bytes));
  try {
    PROBE_CUDA(cudaMemset(ptr_, 0, bytes));
    // The memset runs on the legacy stream, which the probe's non-blocking streams do not wait for.
    PROBE_CUDA(cudaDeviceSynchronize());
  } catch (...) {
    cudaFree(ptr_);
    throw;
  }
}

DeviceBuffer::~DeviceBuffer() { cudaFree(ptr_); }

Stream::Stream(int device) : device_(device) {
  DeviceScope scope(device);
  PROBE_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { PROBE_CUDA(cudaStreamSynchronize(stream_)); }

Event::Event(int device) {
  DeviceScope scope(device);
  PROBE_CUDA(cudaEventCreate(&event_));
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

GraphExec::~GraphExec() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
}

namespace {

std::string device_label(int device) {
  cudaDeviceProp prop = {};
  PROBE_CUDA(cudaGetDeviceProperties(&prop, device));
  return "GPU " + std::to_string(device) + " (" + prop.name + ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
}

void enable_peer(int from, int to) {
  DeviceScope scope(from);
  const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
  if (status == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return;
  }
  PROBE_CUDA(status);
}

// Single thread: the smallest non-zero step between two reads of the global
// timer, over a bounded number of reads.
__global__ void globaltimer_tick_kernel(unsigned long long* tick) {
  uint64_t smallest = ~0ull;
  uint64_t last = global_ns();
  for (int i = 0; i < 200000 && smallest > 1; ++i) {
    const uint64_t now = global_ns();
    if (now != last) {
      if (now - last < smallest) smallest = now - last;
      last = now;
    }
  }
  *tick = smallest == ~0ull ? 0 : smallest;
}

}  // namespace

Sides open_sides(bool force_same_gpu) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw NoDevice(std::string("cudaGetDeviceCount: ") + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                   ")");
  }
  if (count < 1) throw NoDevice("cudaGetDeviceCount reports 0 devices");

  Sides sides;
  sides.name_a = device_label(0);
  std::string why_same;
  if (force_same_gpu) {
    why_same = "--same-gpu";
  } else if (count < 2) {
    why_same = "one GPU visible";
  } else {
    int a_to_b = 0, b_to_a = 0;
    PROBE_CUDA(cudaDeviceCanAccessPeer(&a_to_b, 0, 1));
    PROBE_CUDA(cudaDeviceCanAccessPeer(&b_to_a, 1, 0));
    if (a_to_b && b_to_a) {
      enable_peer(0, 1);
      enable_peer(1, 0);
      sides.device_b = 1;
      sides.same_gpu = false;
      sides.name_b = device_label(1);
      sides.link = "GPU 0 <-> GPU 1, peer access enabled both ways (NVLink where the two are linked by it)";
      return sides;
    }
    why_same = "GPUs 0 and 1 have no peer access";
  }
  sides.name_b = sides.name_a;
  sides.link = "same GPU: not NVLink (" + why_same + "): both sides on GPU 0";
  return sides;
}

double measure_globaltimer_tick_ns(const Sides& sides) {
  DeviceBuffer tick(sides.device_a, sizeof(unsigned long long));
  Stream stream(sides.device_a);
  {
    DeviceScope scope(sides.device_a);
    launch(globaltimer_tick_kernel, 1, 1, stream.get(), false, tick.as<unsigned long long>());
  }
  stream.synchronize();
  unsigned long long value = 0;
  PROBE_CUDA(cudaMemcpy(&value, tick.as<unsigned long long>(), sizeof value, cudaMemcpyDeviceToHost));
  return double(value);
}

}  // namespace moe_ep_probe
