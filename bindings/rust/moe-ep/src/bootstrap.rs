//! Bootstraps: how the ranks exchange a few bytes at create and destroy.
use moe_ep_sys as sys;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Any launcher's collective layer (MPI, a server's own RPC, threads).
///
/// Both calls are blocking collectives: every rank of the group calls them in
/// the same order.  They may be called from whichever thread calls into the
/// handle, hence `Send + Sync`.
pub trait Bootstrap: Send + Sync {
    fn rank(&self) -> i32;
    fn world_size(&self) -> i32;
    /// Rank r's `send` must land at `recv[r * send.len()..(r + 1) * send.len()]`
    /// on every rank; `recv.len() == world_size * send.len()`.
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), BoxError>;
    fn barrier(&self) -> Result<(), BoxError>;
}

/// What the C library's `ctx` points at: the bootstrap plus the last callback
/// error, which is added to the library's message when a call fails with
/// BOOTSTRAP.  Boxed by the handle, so its address is stable.
///
/// `abandoned`: a call timed out while the handle still exchanged through the
/// callbacks, so the library may have left one running (or about to start)
/// on its exchange thread, and it reads this ctx until it returns.  The
/// handle then never frees the ctx (nor the bootstrap it holds).
pub(crate) struct Ctx {
    pub(crate) inner: Arc<dyn Bootstrap>,
    pub(crate) last_error: Mutex<Option<String>>,
    abandoned: AtomicBool,
    callbacks_after_create: bool,
}

impl Ctx {
    /// `callbacks_after_create`: false for a failure_policy MASK handle,
    /// which exchanges through the store once created.
    pub(crate) fn new(inner: Arc<dyn Bootstrap>, callbacks_after_create: bool) -> Box<Ctx> {
        Box::new(Ctx { inner, last_error: Mutex::new(None), abandoned: AtomicBool::new(false),
                       callbacks_after_create })
    }

    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::SeqCst);
    }

    pub(crate) fn abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    pub(crate) fn callbacks_after_create(&self) -> bool {
        self.callbacks_after_create
    }

    pub(crate) fn raw(&self) -> Result<sys::moe_ep_bootstrap_t, crate::Error> {
        let mut b = sys::moe_ep_bootstrap_t::default();
        crate::error::check(unsafe { sys::moe_ep_bootstrap_init(&mut b, std::mem::size_of_val(&b)) })?;
        b.rank = self.inner.rank();
        b.world_size = self.inner.world_size();
        b.ctx = self as *const Ctx as *mut c_void;
        b.allgather = Some(allgather_trampoline);
        b.barrier = Some(barrier_trampoline);
        Ok(b)
    }

    fn record(&self, what: String) {
        if let Ok(mut slot) = self.last_error.lock() {
            *slot = Some(what);
        }
    }

    pub(crate) fn take_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|mut s| s.take())
    }
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

// A panic must not unwind into C (that aborts the process): it is caught and
// turned into a non-zero return, which the library reports as BOOTSTRAP.
unsafe extern "C" fn allgather_trampoline(ctx: *mut c_void, send: *const c_void, recv: *mut c_void,
                                          bytes_per_rank: usize) -> i32 {
    let ctx = unsafe { &*(ctx as *const Ctx) };
    let world = ctx.inner.world_size().max(0) as usize;
    let Some(total) = bytes_per_rank.checked_mul(world) else {
        ctx.record(format!("allgather: {bytes_per_rank} bytes x {world} ranks overflows"));
        return -3;
    };
    let (send, recv): (&[u8], &mut [u8]) = if bytes_per_rank == 0 {
        (&[], &mut [])
    } else {
        unsafe {
            (std::slice::from_raw_parts(send as *const u8, bytes_per_rank),
             std::slice::from_raw_parts_mut(recv as *mut u8, total))
        }
    };
    match catch_unwind(AssertUnwindSafe(|| ctx.inner.allgather(send, recv))) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            ctx.record(format!("allgather failed: {e}"));
            -1
        }
        Err(p) => {
            ctx.record(format!("allgather panicked: {}", panic_message(p)));
            -2
        }
    }
}

unsafe extern "C" fn barrier_trampoline(ctx: *mut c_void) -> i32 {
    let ctx = unsafe { &*(ctx as *const Ctx) };
    match catch_unwind(AssertUnwindSafe(|| ctx.inner.barrier())) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            ctx.record(format!("barrier failed: {e}"));
            -1
        }
        Err(p) => {
            ctx.record(format!("barrier panicked: {}", panic_message(p)));
            -2
        }
    }
}

/// A group of one process: allgather is a copy.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleRank;

impl Bootstrap for SingleRank {
    fn rank(&self) -> i32 {
        0
    }
    fn world_size(&self) -> i32 {
        1
    }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), BoxError> {
        recv.copy_from_slice(send);
        Ok(())
    }
    fn barrier(&self) -> Result<(), BoxError> {
        Ok(())
    }
}

struct Shared {
    slots: Mutex<Vec<Vec<u8>>>,
    barrier: Barrier,
}

/// One rank of a group whose ranks are threads of this process (tests, or a
/// single-process server that drives several devices).
pub struct ThreadRank {
    rank: i32,
    world: i32,
    shared: Arc<Shared>,
}

/// `world` bootstraps that form one group; hand one to each thread.
pub fn thread_group(world: i32) -> Vec<Arc<ThreadRank>> {
    assert!(world > 0, "thread_group: world must be > 0, got {world}");
    let shared = Arc::new(Shared {
        slots: Mutex::new(vec![Vec::new(); world as usize]),
        barrier: Barrier::new(world as usize),
    });
    (0..world).map(|rank| Arc::new(ThreadRank { rank, world, shared: shared.clone() })).collect()
}

impl Bootstrap for ThreadRank {
    fn rank(&self) -> i32 {
        self.rank
    }
    fn world_size(&self) -> i32 {
        self.world
    }
    fn allgather(&self, send: &[u8], recv: &mut [u8]) -> Result<(), BoxError> {
        self.shared.slots.lock().map_err(|_| "poisoned")?[self.rank as usize] = send.to_vec();
        self.shared.barrier.wait();
        let result = (|| {
            let slots = self.shared.slots.lock().map_err(|_| "poisoned")?;
            for (r, slot) in slots.iter().enumerate() {
                if slot.len() != send.len() {
                    return Err(format!("rank {r} gathered {} bytes, rank {} {}", slot.len(), self.rank,
                                       send.len()).into());
                }
                recv[r * send.len()..(r + 1) * send.len()].copy_from_slice(slot);
            }
            Ok(())
        })();
        // Nobody overwrites a slot before every rank has read it, even on error.
        self.shared.barrier.wait();
        result
    }
    fn barrier(&self) -> Result<(), BoxError> {
        self.shared.barrier.wait();
        Ok(())
    }
}
