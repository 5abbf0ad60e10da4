// Open MPI adapter (libmoe_ep_mpi): fills a moe_ep_bootstrap_t from an MPI
// communicator.  It lives in its own small library so that libmoe_ep itself
// never links MPI.  The communicator is duplicated so that moe_ep's traffic
// can never match the application's own messages.
#include <mpi.h>

#include <atomic>
#include <new>
#include <string>

#include "moe_ep_mpi.h"

namespace {

// Failures carry a message through the core's moe_ep_set_last_error, read
// with moe_ep_last_error() like any other moe_ep call.
moe_ep_status_t failure(moe_ep_status_t status, const std::string& message) {
  moe_ep_set_last_error(message.c_str());
  return status;
}

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

// `in_flight` counts the callbacks running now.  A handle whose exchange
// timed out leaves its callback running on an abandoned thread (inside
// MPI_Allgather, say, waiting for a dead peer) after destroy returns; release
// refuses while any runs, so that the communicator is never freed under it.
struct MpiContext {
  MPI_Comm comm = MPI_COMM_NULL;
  std::atomic<int> in_flight{0};
};

// Counts one running callback for as long as it lives.
class InFlight {
 public:
  explicit InFlight(void* ctx) : c_(static_cast<MpiContext*>(ctx)) { c_->in_flight.fetch_add(1); }
  ~InFlight() { c_->in_flight.fetch_sub(1); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  MpiContext* context() const { return c_; }

 private:
  MpiContext* c_;
};

int32_t allgather(void* ctx, const void* send, void* recv, size_t bytes_per_rank) {
  const InFlight running(ctx);
  MpiContext* c = running.context();
  if (bytes_per_rank > static_cast<size_t>(INT32_MAX)) {  // MPI counts are int
    failure(MOE_EP_ERROR_BOOTSTRAP, "MPI adapter: bytes_per_rank above INT32_MAX (" +
                                        std::to_string(bytes_per_rank) + ") does not fit an MPI count");
    return -2;
  }
  const int rc = MPI_Allgather(send, static_cast<int>(bytes_per_rank), MPI_BYTE, recv,
                               static_cast<int>(bytes_per_rank), MPI_BYTE, c->comm);
  if (rc != MPI_SUCCESS) {
    failure(MOE_EP_ERROR_BOOTSTRAP, "MPI_Allgather failed: " + mpi_error_text(rc));
    return -1;
  }
  return 0;
}

int32_t barrier(void* ctx) {
  const InFlight running(ctx);
  const int rc = MPI_Barrier(running.context()->comm);
  if (rc != MPI_SUCCESS) {
    failure(MOE_EP_ERROR_BOOTSTRAP, "MPI_Barrier failed: " + mpi_error_text(rc));
    return -1;
  }
  return 0;
}

moe_ep_status_t require_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return failure(MOE_EP_ERROR_INVALID_STATE, std::string("MPI: expected an initialised MPI, got ") +
                                                   (finalized ? "a finalised one" : "MPI_Init not called yet"));
  }
  return MOE_EP_SUCCESS;
}

// `function` names the entry point in messages.  The struct size is checked
// (by the core's moe_ep_bootstrap_init, which also writes the caller's size
// only) before MPI_Comm_dup: a refused size leaves *b untouched and
// duplicates nothing.  Every accepted size is at least the first released
// moe_ep_bootstrap_t, which holds each field written here.
moe_ep_status_t init_from(MPI_Comm comm, moe_ep_bootstrap_t* b, size_t struct_size, const char* function) {
  if (b == nullptr) return failure(MOE_EP_ERROR_INVALID_ARGUMENT, "bootstrap: expected a non-NULL pointer, got NULL");
  if (comm == MPI_COMM_NULL) {
    return failure(MOE_EP_ERROR_INVALID_ARGUMENT, "mpi_comm: expected a valid communicator, got MPI_COMM_NULL");
  }
  const moe_ep_status_t sized = moe_ep_bootstrap_init(b, struct_size);
  if (sized != MOE_EP_SUCCESS) {
    // The core names its own init ("struct_size of moe_ep_bootstrap_init: expected ...").
    const std::string core = moe_ep_last_error();
    const size_t colon = core.find(": ");
    return failure(sized, std::string("struct_size of ") + function +
                              (colon == std::string::npos ? ": " + core : core.substr(colon)));
  }
  auto* ctx = new (std::nothrow) MpiContext;
  if (ctx == nullptr) return failure(MOE_EP_ERROR_OUT_OF_MEMORY, "MPI adapter: out of host memory");
  int rank = 0, size = 0;
  const int rc = MPI_Comm_dup(comm, &ctx->comm);
  if (rc != MPI_SUCCESS || MPI_Comm_rank(ctx->comm, &rank) != MPI_SUCCESS ||
      MPI_Comm_size(ctx->comm, &size) != MPI_SUCCESS) {
    if (rc == MPI_SUCCESS) MPI_Comm_free(&ctx->comm);
    delete ctx;
    return failure(MOE_EP_ERROR_BOOTSTRAP, "MPI_Comm_dup failed: " + mpi_error_text(rc));
  }
  b->rank = rank;
  b->world_size = size;
  b->ctx = ctx;
  b->allgather = allgather;
  b->barrier = barrier;
  return MOE_EP_SUCCESS;
}

}  // namespace

extern "C" {

moe_ep_status_t moe_ep_mpi_bootstrap_init(const void* mpi_comm, moe_ep_bootstrap_t* bootstrap, size_t struct_size) {
  moe_ep_set_last_error(nullptr);
  if (mpi_comm == nullptr) {
    return failure(MOE_EP_ERROR_INVALID_ARGUMENT, "mpi_comm: expected a pointer to an MPI_Comm, got NULL");
  }
  const moe_ep_status_t s = require_initialized();
  if (s != MOE_EP_SUCCESS) return s;
  return init_from(*static_cast<const MPI_Comm*>(mpi_comm), bootstrap, struct_size, "moe_ep_mpi_bootstrap_init");
}

moe_ep_status_t moe_ep_mpi_bootstrap_init_fint(int32_t mpi_fint, moe_ep_bootstrap_t* bootstrap, size_t struct_size) {
  moe_ep_set_last_error(nullptr);
  const moe_ep_status_t s = require_initialized();
  if (s != MOE_EP_SUCCESS) return s;
  return init_from(MPI_Comm_f2c(static_cast<MPI_Fint>(mpi_fint)), bootstrap, struct_size,
                   "moe_ep_mpi_bootstrap_init_fint");
}

moe_ep_status_t moe_ep_mpi_bootstrap_release(moe_ep_bootstrap_t* bootstrap) {
  moe_ep_set_last_error(nullptr);
  if (bootstrap == nullptr || bootstrap->ctx == nullptr || bootstrap->allgather != allgather) {
    return MOE_EP_SUCCESS;
  }
  auto* ctx = static_cast<MpiContext*>(bootstrap->ctx);
  const int running = ctx->in_flight.load();
  if (running > 0) {  // freeing the communicator now would pull it from under that callback
    return failure(MOE_EP_ERROR_INVALID_STATE,
                   "moe_ep_mpi_bootstrap_release: expected no callback running on this bootstrap, got " +
                       std::to_string(running) +
                       " (an exchange that timed out is still inside an MPI collective on its abandoned thread); "
                       "nothing was released: call release again once the peers have caught up, or end the job "
                       "with MPI_Abort (MPI_Finalize would wait for that collective)");
  }
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
