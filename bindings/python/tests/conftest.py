"""Shared helpers.  The library under test comes from $MOE_EP_LIBRARY (set by
the CTest registration) or the dynamic loader's path."""

import ctypes
import os
import sys
import threading

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for `import reference`

import moe_ep  # noqa: E402


class ThreadGroup:
    """A group of `world` ranks run as threads of this process, with a
    CallbackBootstrap each.  ctypes releases the GIL during library calls, so
    the ranks really run concurrently inside collectives."""

    def __init__(self, world, timeout=60.0):
        self.world = world
        self._barrier = threading.Barrier(world, timeout=timeout)
        self._slots = [b""] * world

    def bootstrap(self, rank):
        def allgather(send, recv, nbytes):
            self._slots[rank] = ctypes.string_at(send, nbytes) if nbytes else b""
            self._barrier.wait()
            for r in range(self.world):
                ctypes.memmove(recv + r * nbytes, self._slots[r], nbytes)
            self._barrier.wait()  # nobody overwrites a slot before all have read it

        return moe_ep.CallbackBootstrap(rank, self.world, allgather, lambda: self._barrier.wait())

    def run(self, fn):
        """fn(rank, bootstrap) on every rank; returns the results in rank order
        and re-raises the first rank's exception."""
        results = [None] * self.world
        errors = [None] * self.world

        def body(rank):
            try:
                results[rank] = fn(rank, self.bootstrap(rank))
            except BaseException as e:  # reported below, with its rank
                errors[rank] = e
                self._barrier.abort()  # free the other ranks instead of hanging

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rank, e in enumerate(errors):
            if e is not None and not isinstance(e, threading.BrokenBarrierError):
                raise AssertionError(f"rank {rank} failed: {e!r}") from e
        for rank, e in enumerate(errors):
            if e is not None:
                raise AssertionError(f"rank {rank} failed: {e!r}") from e
        return results


@pytest.fixture
def thread_group():
    return ThreadGroup


def host_kwargs(case, **extra):
    """MoeEp keyword arguments for a reference.Case on the HOST backend."""
    kw = dict(num_experts=case.E, top_k=case.K, max_tokens_per_rank=case.max_tpr, hidden_size=case.H,
              hidden_dtype="float32", combine_dtype=case.combine_dtype.name, invalid_expert_id=case.invalid,
              backend="host", timeout_ms=60000)
    if case.scale_elems:
        kw.update(scale_row_elems=case.scale_elems, scale_dtype="float32")
    kw.update(extra)
    return kw
