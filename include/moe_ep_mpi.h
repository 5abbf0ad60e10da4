/*
 * moe_ep_mpi.h -- the Open MPI bootstrap adapter of moe_ep.
 *
 * These functions are exported by libmoe_ep_mpi.so, not by libmoe_ep.so:
 * the core library neither links nor needs MPI.  Link with -lmoe_ep_mpi
 * (pkg-config moe_ep_mpi, or CMake's moe_ep::moe_ep_mpi) and your MPI.
 *
 * Like moe_ep_c.h this header is C99 and C++ clean and includes no MPI
 * header: a communicator is passed by address (`const void*` pointing at an
 * MPI_Comm) or as its Fortran handle (MPI_Comm_c2f), so that languages
 * without MPI's C types can call it too.  The adapter must have been built
 * against the same MPI as the caller.
 */
#ifndef MOE_EP_MPI_H
#define MOE_EP_MPI_H

#include "moe_ep_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over the communicator: duplicates *(const MPI_Comm*)mpi_comm and
 * fills *bootstrap (rank, world_size, callbacks, ctx) from the duplicate.
 * struct_size: sizeof(moe_ep_bootstrap_t) of the caller's header, with the
 * rule of moe_ep_bootstrap_init (which this calls first): exactly that many
 * bytes are written, and a size it refuses fails with
 * MOE_EP_ERROR_INVALID_ARGUMENT before any MPI collective, leaving *bootstrap
 * untouched and duplicating nothing.  Release it with
 * moe_ep_mpi_bootstrap_release once every handle created from it is
 * destroyed.  MPI must be initialised.  On failure, moe_ep_last_error() says
 * why (for example "MPI: expected an initialised MPI, got MPI_Init not called
 * yet"). */
MOE_EP_API moe_ep_status_t moe_ep_mpi_bootstrap_init(const void* mpi_comm, moe_ep_bootstrap_t* bootstrap,
                                                     size_t struct_size);

/* The same from a Fortran handle (MPI_Comm_c2f; mpi4py: comm.py2f()). */
MOE_EP_API moe_ep_status_t moe_ep_mpi_bootstrap_init_fint(int32_t mpi_fint, moe_ep_bootstrap_t* bootstrap,
                                                          size_t struct_size);

/* Frees the duplicated communicator; zeroes the callbacks.  NULL is a no-op.
 * After a TIMEOUT, a callback may still be running on the destroyed handle's
 * abandoned thread (inside an MPI collective that waits for a late or dead
 * peer): release then frees nothing and returns MOE_EP_ERROR_INVALID_STATE
 * with a message, and may be called again later.  While it refuses, do not
 * call MPI_Finalize (it would wait for that collective): end the job with
 * MPI_Abort, or wait until release succeeds. */
MOE_EP_API moe_ep_status_t moe_ep_mpi_bootstrap_release(moe_ep_bootstrap_t* bootstrap);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOE_EP_MPI_H */
