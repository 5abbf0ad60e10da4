//! The library's Open MPI bootstrap adapter (libmoe_ep_mpi), for programs
//! launched with mpirun (feature `mpi`).
//!
//! The adapter duplicates the communicator it is given, so moe_ep's traffic
//! never matches the application's own messages.  It takes the communicator
//! as a pointer to an `MPI_Comm` or as its Fortran handle, so no MPI crate is
//! needed here: with the `mpi` crate (rsmpi), pass
//! `&comm.as_raw() as *const _ as *const c_void`; from C, `MPI_Comm_c2f(comm)`.
//! libmoe_ep_mpi must have been built against the same MPI as the program.
use crate::error::{check, Result};
use crate::library_bootstrap::{forward_bootstrap, LibraryBootstrap};
use moe_ep_sys as sys;
use std::ffi::c_void;

/// A bootstrap over a duplicate of an MPI communicator.  MPI must be
/// initialised before it is made and finalised only after it is dropped
/// (Drop frees the duplicate).  Its collectives are serialised by a lock: a
/// program that calls into handles of one bootstrap from several threads
/// needs MPI_THREAD_SERIALIZED or better.
pub struct MpiBootstrap(LibraryBootstrap);

impl MpiBootstrap {
    /// Collective over `comm`.
    ///
    /// # Safety
    /// `comm` must point at a valid `MPI_Comm` of the MPI libmoe_ep_mpi was
    /// built with, for the duration of the call.
    pub unsafe fn from_raw_comm(comm: *const c_void) -> Result<Self> {
        let mut raw = sys::moe_ep_bootstrap_t::default();
        check(unsafe { sys::moe_ep_mpi_bootstrap_init(comm, &mut raw, std::mem::size_of_val(&raw)) })?;
        Ok(Self::wrap(raw))
    }

    /// Collective over the communicator with Fortran handle `fint`
    /// (`MPI_Comm_c2f`).  A handle that names no communicator is refused by
    /// the adapter with its reason.
    pub fn from_fortran_handle(fint: i32) -> Result<Self> {
        let mut raw = sys::moe_ep_bootstrap_t::default();
        check(unsafe { sys::moe_ep_mpi_bootstrap_init_fint(fint, &mut raw, std::mem::size_of_val(&raw)) })?;
        Ok(Self::wrap(raw))
    }

    fn wrap(raw: sys::moe_ep_bootstrap_t) -> Self {
        MpiBootstrap(LibraryBootstrap::new(raw, "MPI", sys::moe_ep_mpi_bootstrap_release))
    }
}

forward_bootstrap!(MpiBootstrap);
