// Device-only probe (not part of the library): does NCCL's user-buffer
// registration (ncclCommRegister on both sides) make its grouped send/recv
// over NVLink faster here?  Registered send and receive buffers let NCCL's
// kernel copy straight into the peer's buffer instead of through its FIFO.
// Moves the DeepSeek 4096-token peer segment (4096 x 7168 bf16 = 56 MiB) both
// ways at once, eager and in a CUDA graph, from:
//   plain       cudaMalloc buffers, unregistered (what the bench's
//               "NCCL's own" and the NCCL backend use today);
//   memalloc    ncclMemAlloc buffers, unregistered;
//   registered  ncclMemAlloc buffers, ncclCommRegister'ed on both sides;
//   cudareg     cudaMalloc buffers, ncclCommRegister'ed on both sides.
// Prints the median over iterations of the slower rank's GPU time.
//   build: nvcc -O2 -arch=sm_90 -I$NCCL/include -I$MPI_INCLUDE nccl_register_probe.cu \
//          $NCCL/lib/libnccl.so.2 -lmpi -o probe
//   run:   mpirun -np 2 ./probe [bytes]
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(2);                                                                          \
    }                                                                                        \
  } while (0)
#define NK(x)                                                                                \
  do {                                                                                       \
    ncclResult_t r = (x);                                                                    \
    if (r != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r)); \
      std::exit(3);                                                                          \
    }                                                                                        \
  } while (0)

static int g_rank, g_world;

static void exchange(ncclComm_t comm, const void* send, void* recv, size_t bytes, cudaStream_t s) {
  const int peer = 1 - g_rank;
  NK(ncclGroupStart());
  NK(ncclSend(send, bytes, ncclInt8, peer, comm, s));
  NK(ncclRecv(recv, bytes, ncclInt8, peer, comm, s));
  NK(ncclGroupEnd());
}

static double slower_median(std::vector<float>& t) {
  std::sort(t.begin(), t.end());
  double mine = t[t.size() / 2], worst = 0;
  MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

static double time_eager(ncclComm_t comm, const void* send, void* recv, size_t bytes, cudaStream_t s, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters + 3; ++i) {
    CK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    CK(cudaEventRecord(a, s));
    exchange(comm, send, recv, bytes, s);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms * 1000.0f);
  }
  return slower_median(t);
}

static double time_graph(ncclComm_t comm, const void* send, void* recv, size_t bytes, cudaStream_t s, int iters) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  exchange(comm, send, recv, bytes, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters + 3; ++i) {
    CK(cudaStreamSynchronize(s));
    MPI_Barrier(MPI_COMM_WORLD);
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms * 1000.0f);
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return slower_median(t);
}

// The receive buffer holds the peer's pattern afterwards (a wrong result
// would make any timing meaningless).
static bool verify(const char* recv, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  CK(cudaMemcpy(h.data(), recv, bytes, cudaMemcpyDeviceToHost));
  const int peer = 1 - g_rank;
  for (size_t i = 0; i < bytes; i += 4093) {
    if (h[i] != static_cast<unsigned char>((i * 7 + peer * 31) & 0xFF)) return false;
  }
  return true;
}

static void fill(char* send, size_t bytes) {
  std::vector<unsigned char> h(bytes);
  for (size_t i = 0; i < bytes; ++i) h[i] = static_cast<unsigned char>((i * 7 + g_rank * 31) & 0xFF);
  CK(cudaMemcpy(send, h.data(), bytes, cudaMemcpyHostToDevice));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (g_world != 2) {
    std::fprintf(stderr, "two ranks\n");
    return 1;
  }
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{4096} * 7168 * 2;
  const int iters = 20;
  CK(cudaSetDevice(g_rank));
  ncclUniqueId id;
  if (g_rank == 0) NK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  NK(ncclCommInitRank(&comm, 2, id, g_rank));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int version = 0;
  NK(ncclGetVersion(&version));
  if (g_rank == 0) std::printf("nccl %d, %zu bytes each way\n", version, bytes);

  struct Kind {
    const char* name;
    bool nccl_alloc, registered;
  };
  const Kind kinds[] = {{"plain", false, false},
                        {"memalloc", true, false},
                        {"registered", true, true},
                        {"cudareg", false, true},
                        {"plain", false, false}};
  for (const Kind& k : kinds) {
    char *send = nullptr, *recv = nullptr;
    if (k.nccl_alloc) {
      NK(ncclMemAlloc(reinterpret_cast<void**>(&send), bytes));
      NK(ncclMemAlloc(reinterpret_cast<void**>(&recv), bytes));
    } else {
      CK(cudaMalloc(&send, bytes));
      CK(cudaMalloc(&recv, bytes));
    }
    void *hs = nullptr, *hr = nullptr;
    if (k.registered) {
      NK(ncclCommRegister(comm, send, bytes, &hs));
      NK(ncclCommRegister(comm, recv, bytes, &hr));
    }
    fill(send, bytes);
    CK(cudaMemset(recv, 0, bytes));
    const double eager = time_eager(comm, send, recv, bytes, s, iters);
    const bool ok_eager = verify(recv, bytes);
    CK(cudaMemset(recv, 0, bytes));
    const double graph = time_graph(comm, send, recv, bytes, s, iters);
    const bool ok_graph = verify(recv, bytes);
    if (g_rank == 0) {
      std::printf("%-11s eager %8.2f us (%.1f GB/s) %s | graph %8.2f us %s\n", k.name, eager, bytes / eager / 1e3,
                  ok_eager ? "ok" : "WRONG", graph, ok_graph ? "ok" : "WRONG");
      std::fflush(stdout);
    }
    if (k.registered) {
      NK(ncclCommDeregister(comm, hs));
      NK(ncclCommDeregister(comm, hr));
    }
    if (k.nccl_alloc) {
      NK(ncclMemFree(send));
      NK(ncclMemFree(recv));
    } else {
      CK(cudaFree(send));
      CK(cudaFree(recv));
    }
  }
  NK(ncclCommDestroy(comm));
  MPI_Finalize();
  return 0;
}
