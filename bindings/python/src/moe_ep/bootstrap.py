"""Bootstraps: how the ranks of a group exchange a few bytes at create/destroy.

- CallbackBootstrap: any Python allgather/barrier (the base of the others).
- SingleRankBootstrap: a group of one process, no launcher needed.
- MpiBootstrap / from_mpi4py(comm): the library's Open MPI adapter
  (libmoe_ep_mpi) on a duplicate of an mpi4py communicator.
- from_torch_distributed(group): all_gather_into_tensor on a torch.distributed
  process group (gloo or NCCL), called from a ctypes callback.
- StoreBootstrap / from_store(address, prefix, rank, world_size): the
  library's bootstrap over a moe_ep store (moe_ep.Store), for launchers
  without MPI.
- RejoinBootstrap(rank, world_size): no callbacks, for a replacement rank
  (MoeEp(..., rejoin=True)), which meets its group through the store.

A bootstrap must outlive every handle created from it (destroy uses it); the
handle holds a reference, so this is automatic unless close() is called early.

A call that times out may leave a callback running on the handle's exchange
thread, and the C library keeps using the bootstrap's callbacks and ctx until
it returns (moe_ep_c.h, moe_ep_bootstrap_t).  Nothing here can tell when that
happens, so such a bootstrap is kept alive for the rest of the process
(_abandon): its ctypes callbacks are never freed and close() no longer
releases its C state.
"""

import ctypes
import threading
import warnings

from . import _lib
from ._errors import MoeEpError, check


# Bootstraps whose callbacks a timed-out handle may still be running (see the
# module's doc): referenced here for the rest of the process.
_abandoned = []
_abandoned_lock = threading.Lock()


def _abandon(bootstrap):
    """Keeps `bootstrap` (its ctypes callbacks, its C ctx) alive for good: a
    callback left running after a timeout may use it at any later moment."""
    with _abandoned_lock:
        if not getattr(bootstrap, "abandoned", False):
            bootstrap.abandoned = True
            _abandoned.append(bootstrap)


class Bootstrap:
    """Base: owns a moe_ep_bootstrap_t (`.struct`).  `abandoned` is True once a
    handle created from it timed out with a callback possibly still running:
    it is then kept alive, and close() leaves its C state in place."""

    abandoned = False

    def __init__(self):
        self.struct = _lib.BootstrapStruct()
        check(_lib.lib().moe_ep_bootstrap_init(ctypes.byref(self.struct), ctypes.sizeof(self.struct)))

    def _release_allowed(self, what):
        if self.abandoned:
            warnings.warn(f"moe_ep: {what}: not released, a handle created from this bootstrap timed out and "
                          "the library may still be running one of its callbacks (moe_ep_c.h, "
                          "moe_ep_bootstrap_t); it is kept for the rest of the process", ResourceWarning,
                          stacklevel=3)
            return False
        return True

    @property
    def rank(self):
        return self.struct.rank

    @property
    def world_size(self):
        return self.struct.world_size

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class CallbackBootstrap(Bootstrap):
    """A bootstrap from two Python callables.

    allgather(send_ptr: int, recv_ptr: int, nbytes: int) -> None
        rank r's `nbytes` bytes at send_ptr must land at recv_ptr + r*nbytes
        on every rank (use ctypes.string_at / ctypes.memmove).
    barrier() -> None

    An exception in a callback makes the library call fail with
    MOE_EP_ERROR_BOOTSTRAP; the exception is chained as its __cause__.
    """

    def __init__(self, rank, world_size, allgather, barrier):
        super().__init__()
        self._allgather = allgather
        self._barrier = barrier
        self.last_exception = None
        # The CFUNCTYPE objects must stay referenced for as long as C may call
        # them: they are attributes of this object, which the handle keeps.
        self._c_allgather = _lib.ALLGATHER_FN(self._call_allgather)
        self._c_barrier = _lib.BARRIER_FN(self._call_barrier)
        self.struct.rank = rank
        self.struct.world_size = world_size
        self.struct.allgather = self._c_allgather
        self.struct.barrier = self._c_barrier

    def _call_allgather(self, _ctx, send, recv, nbytes):
        try:
            self._allgather(send or 0, recv or 0, int(nbytes))
            return 0
        except BaseException as e:  # nothing may propagate into C
            self.last_exception = e
            return -1

    def _call_barrier(self, _ctx):
        try:
            self._barrier()
            return 0
        except BaseException as e:
            self.last_exception = e
            return -1

    def take_exception(self):
        e, self.last_exception = self.last_exception, None
        return e


class SingleRankBootstrap(CallbackBootstrap):
    """A group of one: allgather is a copy, barrier does nothing."""

    def __init__(self):
        super().__init__(0, 1, lambda s, r, n: ctypes.memmove(r, s, n), lambda: None)


class MpiBootstrap(Bootstrap):
    """libmoe_ep_mpi on a duplicate of an mpi4py communicator.  The duplicate
    is freed by close() (called by the handle's owner, or by `with`)."""

    def __init__(self, comm):
        super().__init__()
        mpi = _lib.mpi_lib()
        fint = int(comm.py2f())
        status = mpi.moe_ep_mpi_bootstrap_init_fint(fint, ctypes.byref(self.struct),
                                                    ctypes.sizeof(self.struct))
        if status != _lib.SUCCESS:
            # The adapter explains itself through the core's moe_ep_last_error().
            said = _lib.lib().moe_ep_last_error().decode(errors="replace")
            raise MoeEpError(status, f"moe_ep_mpi_bootstrap_init_fint(comm.py2f() = {fint}) "
                                     f"[{mpi.loaded_from}]: " +
                             (said or "no message from the adapter"))
        self._open = True

    def close(self):
        if getattr(self, "_open", False) and self._release_allowed("MpiBootstrap.close()"):
            self._open = False
            check(_lib.mpi_lib().moe_ep_mpi_bootstrap_release(ctypes.byref(self.struct)),
                  "moe_ep_mpi_bootstrap_release failed")

    def __del__(self):
        # MPI_Comm_free is formally collective, but Open MPI only marks the
        # communicator for deallocation and waits for no peer, so the garbage
        # collector may call it.  An explicit close() is still preferred.
        if self.abandoned:
            return
        try:
            self.close()
        except Exception:
            pass


def from_mpi4py(comm=None):
    """Bootstrap over an mpi4py communicator (default COMM_WORLD)."""
    if comm is None:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
    return MpiBootstrap(comm)


def from_torch_distributed(group=None):
    """Bootstrap over a torch.distributed process group (default: the world).

    The allgather uses all_gather_into_tensor: on CPU tensors for gloo, on the
    current CUDA device for NCCL (which cannot move host memory)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise MoeEpError(_lib.ERROR_INVALID_STATE, "from_torch_distributed: torch.distributed "
                         "is not initialised (call torch.distributed.init_process_group first)")
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        def device():
            return torch.device("cuda", torch.cuda.current_device())
    else:
        def device():
            return torch.device("cpu")
    state = {"into_tensor": True}

    def allgather(send, recv, nbytes):
        dev = device()
        mine = torch.empty(nbytes, dtype=torch.uint8)
        if nbytes:
            ctypes.memmove(mine.data_ptr(), send, nbytes)
        mine = mine.to(dev)
        out = torch.empty(nbytes * world, dtype=torch.uint8, device=dev)
        if state["into_tensor"]:
            try:
                dist.all_gather_into_tensor(out, mine, group=group)
            except (RuntimeError, NotImplementedError):
                # Older gloo builds lack the fused collective; every rank fails
                # the same way, so every rank falls back together.
                state["into_tensor"] = False
        if not state["into_tensor"]:
            parts = list(out.view(world, nbytes).unbind(0)) if nbytes else \
                [torch.empty(0, dtype=torch.uint8, device=dev) for _ in range(world)]
            dist.all_gather(parts, mine, group=group)
        out = out.cpu()
        if nbytes:
            ctypes.memmove(recv, out.data_ptr(), nbytes * world)

    def barrier():
        dist.barrier(group=group)

    return CallbackBootstrap(rank, world, allgather, barrier)


def _text(value, name):
    """A str (UTF-8) or bytes argument for a `const char*`, refused when it is
    neither or holds a NUL byte (C would see a shorter string)."""
    if isinstance(value, str):
        value = value.encode()
    if not isinstance(value, bytes):
        raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"{name}: expected a str, got {value!r}")
    if b"\0" in value:
        raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"{name}: expected a string without NUL bytes, got {value!r}")
    return value


class StoreBootstrap(Bootstrap):
    """The library's bootstrap over a moe_ep store (moe_ep_bootstrap_from_store):
    allgather and barrier go through the store at `address` ("host:port", see
    moe_ep.Store) under `prefix`, a name unique per group and run; each wait
    is bounded by `timeout_ms`.  Connects at once (MoeEpError BOOTSTRAP naming
    the address when it cannot).  close() (or `with`, or the garbage
    collector: it is not collective) releases it; do that after every handle
    created from it is destroyed."""

    def __init__(self, address, prefix, rank, world_size, timeout_ms=30000):
        super().__init__()
        self.address = _text(address, "address").decode()
        self.prefix = _text(prefix, "prefix").decode()
        check(_lib.lib().moe_ep_bootstrap_from_store(self.address.encode(), self.prefix.encode(), int(rank),
                                                     int(world_size), int(timeout_ms),
                                                     ctypes.byref(self.struct)))
        self._open = True

    def close(self):
        if getattr(self, "_open", False) and self._release_allowed("StoreBootstrap.close()"):
            self._open = False
            check(_lib.lib().moe_ep_bootstrap_release(ctypes.byref(self.struct)))

    def __del__(self):
        if self.abandoned:  # kept on purpose (the module's doc); nothing to say at exit
            return
        try:
            self.close()
        except Exception:
            pass


def from_store(address, prefix, rank, world_size, timeout_ms=30000):
    """A StoreBootstrap: the ranks meet through the store at `address`."""
    return StoreBootstrap(address, prefix, rank, world_size, timeout_ms)


class RejoinBootstrap(Bootstrap):
    """Rank and world size only, no callbacks: what a replacement passes to
    MoeEp(..., rejoin=True), whose create meets the group through the store
    (docs/reliability.md, "Surviving a dead rank")."""

    def __init__(self, rank, world_size):
        super().__init__()
        self.struct.rank = rank
        self.struct.world_size = world_size
