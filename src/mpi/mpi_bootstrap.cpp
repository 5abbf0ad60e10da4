// Open MPI adapter (libmoe_ep_mpi): fills a moe_ep_bootstrap_t from an MPI
// communicator.  It lives in its own small library so that libmoe_ep itself
// never links MPI.  The communicator is duplicated so that moe_ep's traffic
// can never match the application's own messages.
#include <mpi.h>

#include <new>
#include <string>

#include "moe_ep_c.h"

namespace {

// Errors here are few and simple; the core's thread-local message is not
// reachable from this library, so messages go to stderr only when MPI fails.
struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;
};

int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes_per_rank) {
  auto* c = static_cast<MpiContext*>(ctx);
  if (bytes_per_rank > static_cast<size_t>(INT32_MAX)) return -2;  // MPI counts are int
  return MPI_Allgather(send, static_cast<int>(bytes_per_rank), MPI_BYTE, recv,
                       static_cast<int>(bytes_per_rank), MPI_BYTE, c->comm) == MPI_SUCCESS
             ? 0
             : -1;
}

int32_t barrier(void* ctx) {
  return MPI_Barrier(static_cast<MpiContext*>(ctx)->comm) == MPI_SUCCESS ? 0 : -1;
}

moe_ep_status_t init_from(MPI_Comm comm, moe_ep_bootstrap_t* b) {
  if (b == nullptr) return MOE_EP_ERROR_INVALID_ARGUMENT;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return MOE_EP_ERROR_INVALID_STATE;
  if (comm == MPI_COMM_NULL) return MOE_EP_ERROR_INVALID_ARGUMENT;
  auto* ctx = new (std::nothrow) MpiContext;
  if (ctx == nullptr) return MOE_EP_ERROR_OUT_OF_MEMORY;
  int rank = 0, size = 0;
  if (MPI_Comm_dup(comm, &ctx->comm) != MPI_SUCCESS || MPI_Comm_rank(ctx->comm, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(ctx->comm, &size) != MPI_SUCCESS) {
    delete ctx;
    return MOE_EP_ERROR_BOOTSTRAP;
  }
  moe_ep_bootstrap_init(b);
  b->rank = rank;
  b->world_size = size;
  b->ctx = ctx;
  b->allgather = allgather;
  b->barrier = barrier;
  return MOE_EP_SUCCESS;
}

}  // namespace

extern "C" {

moe_ep_status_t moe_ep_mpi_bootstrap_init(const void* mpi_comm, moe_ep_bootstrap_t* bootstrap) {
  if (mpi_comm == nullptr) return MOE_EP_ERROR_INVALID_ARGUMENT;
  return init_from(*static_cast<const MPI_Comm*>(mpi_comm), bootstrap);
}

moe_ep_status_t moe_ep_mpi_bootstrap_init_fint(int32_t mpi_fint, moe_ep_bootstrap_t* bootstrap) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return MOE_EP_ERROR_INVALID_STATE;
  return init_from(MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_fint)), bootstrap);
}

moe_ep_status_t moe_ep_mpi_bootstrap_release(moe_ep_bootstrap_t* bootstrap) {
  if (bootstrap == nullptr || bootstrap->ctx == nullptr || bootstrap->allgather != allgather) {
    return MOE_EP_SUCCESS;
  }
  auto* ctx = static_cast<MpiContext*>(bootstrap->ctx);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && ctx->comm != MPI_COMM_NULL) MPI_Comm_free(&ctx->comm);
  delete ctx;
  bootstrap->ctx = nullptr;
  bootstrap->allgather = nullptr;
  bootstrap->barrier = nullptr;
  return MOE_EP_SUCCESS;
}

}  // extern "C"
