"""Bootstraps: how the ranks of a group exchange a few bytes at create/destroy.

- CallbackBootstrap: any Python allgather/barrier (the base of the others).
- SingleRankBootstrap: a group of one process, no launcher needed.
- MpiBootstrap / from_mpi4py(comm): the library's Open MPI adapter
  (libmoe_ep_mpi) on a duplicate of an mpi4py communicator.
- from_torch_distributed(group): all_gather_into_tensor on a torch.distributed
  process group (gloo or NCCL), called from a ctypes callback.

A bootstrap must outlive every handle created from it (destroy uses it); the
handle holds a reference, so this is automatic unless close() is called early.
"""

import ctypes

from . import _lib
from ._errors import MoeEpError, check


class Bootstrap:
    """Base: owns a moe_ep_bootstrap_t (`.struct`)."""

    def __init__(self):
        self.struct = _lib.BootstrapStruct()
        check(_lib.lib().moe_ep_bootstrap_init(ctypes.byref(self.struct), ctypes.sizeof(self.struct)))

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
        if getattr(self, "_open", False):
            self._open = False
            check(_lib.mpi_lib().moe_ep_mpi_bootstrap_release(ctypes.byref(self.struct)),
                  "moe_ep_mpi_bootstrap_release failed")

    def __del__(self):
        # MPI_Comm_free is formally collective, but Open MPI only marks the
        # communicator for deallocation and waits for no peer, so the garbage
        # collector may call it.  An explicit close() is still preferred.
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
