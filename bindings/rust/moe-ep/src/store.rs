//! The store that survivors of a failure agree through
//! (`FailurePolicy::Mask`; docs/reliability.md, "Surviving a dead rank"), the
//! library's bootstrap over it, and the bootstrap of a replacement rank.
use crate::bootstrap::{Bootstrap, BoxError};
use crate::error::{check, Result};
use crate::library_bootstrap::{forward_bootstrap, LibraryBootstrap};
use crate::c_string;
use moe_ep_sys as sys;
use std::ptr;

/// A moe_ep store server running on threads of this process until dropped
/// (`moe_ep_store_serve` .. `moe_ep_store_destroy`).  Serve it from a process
/// that outlives the ranks (a launcher, an orchestrator): hosted inside a
/// rank it dies with that rank, and with it every survivor's MASK handle.
/// It has no authentication: bind it to an address only the job reaches.
pub struct Store {
    raw: sys::moe_ep_store_t,
    host: Option<String>,
    port: i32,
}

// SAFETY: the store is the library's object, served by its own threads; the
// calls made on it here (moe_ep_store_port, moe_ep_store_destroy on Drop,
// which takes &mut self) are the library's thread-safe free functions.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

impl Store {
    /// Listens on `host:port`: `host` a name or address (None = every
    /// interface), `port` 0 = any free port (see `port`).  A host that does
    /// not resolve or a port in use is `Err(BOOTSTRAP)` with the reason.
    pub fn serve(host: Option<&str>, port: i32) -> Result<Store> {
        let host_c = host.map(|h| c_string(h, "host")).transpose()?;
        let mut raw: sys::moe_ep_store_t = ptr::null_mut();
        check(unsafe { sys::moe_ep_store_serve(host_c.as_ref().map_or(ptr::null(), |h| h.as_ptr()), port, &mut raw) })?;
        let mut store = Store { raw, host: host.map(str::to_string), port: 0 };
        check(unsafe { sys::moe_ep_store_port(store.raw, &mut store.port) })?;
        Ok(store)
    }

    /// The port it listens on (the one chosen for port 0).
    pub fn port(&self) -> i32 {
        self.port
    }

    /// `"host:port"` for `Config::store_address` and `StoreBootstrap`, with
    /// 127.0.0.1 for a store listening on every interface (ranks on other
    /// machines use this machine's name instead).
    pub fn address(&self) -> String {
        format!("{}:{}", self.host.as_deref().unwrap_or("127.0.0.1"), self.port)
    }

    /// Stops the server (a waiting get answers "not found"), reporting the
    /// status; Drop does the same silently.
    pub fn close(mut self) -> Result<()> {
        check(unsafe { sys::moe_ep_store_destroy(&mut self.raw) })
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // NULL (after close) is a no-op.
        unsafe { sys::moe_ep_store_destroy(&mut self.raw) };
    }
}

/// The library's bootstrap over a moe_ep store (`moe_ep_bootstrap_from_store`),
/// for launchers without MPI: allgather and barrier go through the store
/// under a prefix unique per group and run, each wait bounded by the
/// bootstrap's own `timeout_ms`.  Drop releases it: the handles made from it
/// hold it (through `Arc<dyn Bootstrap>`) until they are gone.
pub struct StoreBootstrap(LibraryBootstrap);

impl StoreBootstrap {
    /// Connects to the store at `address` ("host:port") at once: an address
    /// that is no "host:port" is `Err(INVALID_ARGUMENT)` naming `address`,
    /// one where nobody listens `Err(BOOTSTRAP)` naming it.
    pub fn connect(address: &str, prefix: &str, rank: i32, world_size: i32, timeout_ms: i32) -> Result<Self> {
        let (address_c, prefix_c) = (c_string(address, "address")?, c_string(prefix, "prefix")?);
        let mut raw = sys::moe_ep_bootstrap_t::default();
        check(unsafe { sys::moe_ep_bootstrap_init(&mut raw, std::mem::size_of_val(&raw)) })?;
        check(unsafe {
            sys::moe_ep_bootstrap_from_store(address_c.as_ptr(), prefix_c.as_ptr(), rank, world_size, timeout_ms,
                                             &mut raw)
        })?;
        Ok(StoreBootstrap(LibraryBootstrap::new(raw, "store", sys::moe_ep_bootstrap_release)))
    }
}

forward_bootstrap!(StoreBootstrap);

/// Rank and world size only: what a replacement passes to `MoeEp::new` with
/// `Config::rejoin(true)`, whose create meets the group through the store and
/// never calls the bootstrap.
#[derive(Debug, Clone, Copy)]
pub struct RejoinBootstrap {
    pub rank: i32,
    pub world_size: i32,
}

impl Bootstrap for RejoinBootstrap {
    fn rank(&self) -> i32 {
        self.rank
    }
    fn world_size(&self) -> i32 {
        self.world_size
    }
    fn allgather(&self, _: &[u8], _: &mut [u8]) -> std::result::Result<(), BoxError> {
        Err("RejoinBootstrap has no collective: a rejoining rank meets its group through the store".into())
    }
    fn barrier(&self) -> std::result::Result<(), BoxError> {
        Err("RejoinBootstrap has no collective: a rejoining rank meets its group through the store".into())
    }
}
