//! A bootstrap that the C library made (the MPI adapter's, the store's):
//! its callbacks called under a lock, its failures reported with the
//! library's last error, and its release function called on Drop.
use crate::bootstrap::{Bootstrap, BoxError};
use crate::error::{Error, Status};
use moe_ep_sys as sys;
use std::ffi::c_void;
use std::sync::Mutex;

pub(crate) type Release = unsafe extern "C" fn(*mut sys::moe_ep_bootstrap_t) -> sys::moe_ep_status_t;

pub(crate) struct LibraryBootstrap {
    raw: Mutex<sys::moe_ep_bootstrap_t>,
    rank: i32,
    world_size: i32,
    kind: &'static str, // "MPI", "store": named in its errors
    release: Release,
}

// SAFETY: the ctx is the library's own heap object (an MPI communicator, a
// store connection); every use goes through the Mutex, one call at a time,
// and Drop has &mut self.
unsafe impl Send for LibraryBootstrap {}
unsafe impl Sync for LibraryBootstrap {}

impl LibraryBootstrap {
    pub(crate) fn new(raw: sys::moe_ep_bootstrap_t, kind: &'static str, release: Release) -> Self {
        LibraryBootstrap { rank: raw.rank, world_size: raw.world_size, raw: Mutex::new(raw), kind, release }
    }

    fn call(&self, what: &str, f: impl FnOnce(&sys::moe_ep_bootstrap_t) -> Option<i32>)
            -> std::result::Result<(), BoxError> {
        let kind = self.kind;
        let raw = self.raw.lock().map_err(|_| format!("{kind} bootstrap lock poisoned"))?;
        match f(&raw) {
            Some(0) => Ok(()),
            // The library's callback leaves its reason in this thread's last error.
            Some(rc) => Err(Box::new(Error::new(Status::BOOTSTRAP,
                                                format!("{kind} {what} returned {rc}: {}", crate::error::last_error())))),
            None => Err(format!("{kind} {what}: the bootstrap was released").into()),
        }
    }
}

impl Bootstrap for LibraryBootstrap {
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

impl Drop for LibraryBootstrap {
    fn drop(&mut self) {
        if let Ok(raw) = self.raw.get_mut() {
            unsafe { (self.release)(raw) };
        }
    }
}

/// `impl Bootstrap` for a newtype over a LibraryBootstrap (field 0).
macro_rules! forward_bootstrap {
    ($t:ty) => {
        impl crate::bootstrap::Bootstrap for $t {
            fn rank(&self) -> i32 {
                self.0.rank()
            }
            fn world_size(&self) -> i32 {
                self.0.world_size()
            }
            fn allgather(&self, send: &[u8], recv: &mut [u8]) -> std::result::Result<(), crate::bootstrap::BoxError> {
                self.0.allgather(send, recv)
            }
            fn barrier(&self) -> std::result::Result<(), crate::bootstrap::BoxError> {
                self.0.barrier()
            }
        }
    };
}
pub(crate) use forward_bootstrap;
