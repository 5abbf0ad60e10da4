//! The library's Open MPI bootstrap adapter (libmoe_ep_mpi), for programs
//! launched with mpirun (feature `mpi`).
//!
//! The adapter duplicates the communicator it is given, so moe_ep's traffic
//! never matches the application's own messages.  It takes the communicator
//! as a pointer to an `MPI_Comm` or as its Fortran handle, so no MPI crate is
//! needed here: with the `mpi` crate (rsmpi), pass
//! `&comm.as_raw() as *const _ as *const c_void`; from C, `MPI_Comm_c2f(comm)`.
//! libmoe_ep_mpi must have been built against the same MPI as the program.
use crate::bootstrap::{Bootstrap, BoxError};
use crate::error::{check, Error, Result, Status};
use moe_ep_sys as sys;
use std::ffi::c_void;
use std::sync::Mutex;

/// A bootstrap over a duplicate of an MPI communicator.  MPI must be
/// initialised before it is made and finalised only after it is dropped
/// (Drop frees the duplicate).  Its collectives are serialised by a lock: a
/// program that calls into handles of one bootstrap from several threads
/// needs MPI_THREAD_SERIALIZED or better.
pub struct MpiBootstrap {
    raw: Mutex<sys::moe_ep_bootstrap_t>,
    rank: i32,
    world_size: i32,
}

// SAFETY: the adapter's ctx is its own heap object holding an MPI
// communicator; every use goes through the Mutex, one call at a time.
unsafe impl Send for MpiBootstrap {}
unsafe impl Sync for MpiBootstrap {}

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
        MpiBootstrap { rank: raw.rank, world_size: raw.world_size, raw: Mutex::new(raw) }
    }

    fn call(&self, what: &str, f: impl FnOnce(&sys::moe_ep_bootstrap_t) -> Option<i32>) -> std::result::Result<(), BoxError> {
        let raw = self.raw.lock().map_err(|_| "MPI bootstrap lock poisoned")?;
        match f(&raw) {
            Some(0) => Ok(()),
            Some(rc) => Err(Box::new(Error::new(Status::BOOTSTRAP,
                                                format!("MPI {what} returned {rc}: {}", crate::error::last_error())))),
            None => Err(format!("MPI {what}: the bootstrap was released").into()),
        }
    }
}

impl Bootstrap for MpiBootstrap {
    fn rank(&self) -> i32 {
        self.rank
    }
    fn world_size(&self) -> i32 {
        self.world_size
    }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> std::result::Result<(), BoxError> {
        if recv.len() != send.len() * self.world_size.max(0) as usize {
            return Err(format!("allgather: recv holds {} bytes, expected {} x {}", recv.len(), send.len(),
                               self.world_size).into());
        }
        self.call("allgather", |raw| {
            raw.allgather.map(|f| unsafe {
                f(raw.ctx, send.as_ptr() as *const c_void, recv.as_mut_ptr() as *mut c_void, send.len())
            })
        })
    }
    fn barrier(&self) -> std::result::Result<(), BoxError> {
        self.call("barrier", |raw| raw.barrier.map(|f| unsafe { f(raw.ctx) }))
    }
}

impl Drop for MpiBootstrap {
    fn drop(&mut self) {
        if let Ok(raw) = self.raw.get_mut() {
            unsafe { sys::moe_ep_mpi_bootstrap_release(raw) };
        }
    }
}
