"""Surviving a dead rank from Python (docs/reliability.md, "Surviving a dead
rank"): moe_ep.Store, the store bootstrap, MoeEp(..., failure_policy="mask"),
on the HOST backend with ranks as threads and the store served by this
process; bad input refused with the library's message; and a timed-out
handle's bootstrap kept alive while the library may still run its callback."""

import ctypes
import gc
import threading
import time
import uuid
import warnings
import weakref

import numpy as np
import pytest

import moe_ep

import checks
import reference
from conftest import host_kwargs

# For the refusals and the timed-out bootstraps: short, nothing waits for it
# but the stalled calls.
TIMEOUT_MS = 500


def prefix(name):
    """A store prefix unique per test run."""
    return f"pytest-{name}-{uuid.uuid4().hex[:8]}"


def run_threads(world, fn):
    """fn(rank) on `world` threads; the results in rank order, the first
    rank's exception re-raised with its rank."""
    results, errors = [None] * world, [None] * world

    def body(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # reported below
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for rank, e in enumerate(errors):
        if e is not None:
            raise AssertionError(f"rank {rank} failed: {e!r}") from e
    assert not any(t.is_alive() for t in threads), "a rank thread did not finish"
    return results


def test_store_serves_reports_its_port_and_closes():
    with moe_ep.Store("127.0.0.1", 0) as store:
        assert not store.closed and 0 < store.port < 65536
        assert store.address == f"127.0.0.1:{store.port}"
    assert store.closed
    store.close()  # idempotent
    with pytest.raises(moe_ep.MoeEpError) as e:
        store.port
    assert e.value.status == moe_ep.ERROR_INVALID_STATE and "closed" in e.value.message
    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.Store("127.0.0.1", -5)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert "port" in e.value.message and "-5" in e.value.message, e.value.message


def test_mask_handles_drop_a_stalled_rank_go_on_and_admit_its_replacement():
    """3 ranks over the store bootstrap with failure_policy "mask": a pair
    against the model; rank 2 stalls; the survivors' next dispatch raises
    TIMEOUT naming rank 2, their poll shows failed_rank 2 and mask epoch 1, and
    the next pairs match the masked model.  Rank 2, back, finds itself dropped
    (sticky TIMEOUT), destroys its handle and rejoins with a new one
    (RejoinBootstrap, rejoin=True) as the survivors make it active again: the
    full group then matches the unmasked model."""
    world, dead, timeout_ms = 3, 2, 1000
    case = reference.Case(seed=91, world=world, num_experts=2 * world, top_k=2, hidden=5, tokens_per_rank=4,
                          scale_elems=2)
    active = [r != dead for r in range(world)]
    masked = case.masked(active)
    assert any((case.owner(inp["ids"]) == dead).any() for inp in case.inputs), "the failure must matter"
    masked_done, old_gone = threading.Event(), threading.Event()
    lock, survivors_masked = threading.Lock(), [0]
    boot, group = prefix("boot"), prefix("mask")

    with moe_ep.Store("127.0.0.1", 0) as store:
        def kw(**extra):
            return host_kwargs(case, timeout_ms=timeout_ms, failure_policy="mask", store_address=store.address,
                               store_prefix=group, **extra)

        def rank_fn(rank):
            out = {}
            with moe_ep.StoreBootstrap(store.address, boot, rank, world, timeout_ms=20000) as bs, \
                 moe_ep.MoeEp(bs, **kw()) as ep:
                out["healthy"], out["before"] = ep.poll_health(), checks.run_rank(ep, case, rank)
                inp = case.inputs[rank]
                if rank == dead:  # stops taking part until the survivors ran masked
                    assert masked_done.wait(60)
                    with pytest.raises(moe_ep.MoeEpError) as dropped:
                        checks.run_rank(ep, case, rank)
                    out["dropped"], out["health"] = dropped.value, ep.poll_health()
                else:
                    start = time.monotonic()
                    with pytest.raises(moe_ep.MoeEpError) as failed:
                        ep.dispatch(inp["x"], inp["ids"], inp["w"], inp["scale"])
                    out["detect_s"] = time.monotonic() - start
                    out["failed"], out["health"], out["mask"] = failed.value, ep.poll_health(), ep.active_ranks()
                    out["after"] = [checks.run_rank(ep, masked, rank, inputs=inp) for _ in range(2)]
                    with lock:
                        survivors_masked[0] += 1
                        if survivors_masked[0] == world - 1:
                            masked_done.set()
                    assert old_gone.wait(60)
                    ep.set_active_ranks([True] * world)  # admits the replacement
                    out["rejoined"], out["final"] = checks.run_rank(ep, case, rank), ep.poll_health()
                    return out
            old_gone.set()
            # The replacement: a new handle of the same rank, met through the store.
            with moe_ep.MoeEp(moe_ep.RejoinBootstrap(rank, world), **kw(rejoin=True)) as ep:
                out["rejoined"], out["final"] = checks.run_rank(ep, case, rank), ep.poll_health()
            return out

        results = run_threads(world, rank_fn)

    for rank, out in enumerate(results):
        assert (out["healthy"].status, out["healthy"].failed_rank, out["healthy"].active_count,
                out["healthy"].mask_epoch) == (moe_ep.SUCCESS, -1, world, 0)
        checks.compare(case, rank, out["before"])
        checks.compare(case, rank, out["rejoined"])
        assert (out["final"].status, out["final"].active_count) == (moe_ep.SUCCESS, world), out["final"]
        if rank == dead:
            e = out["dropped"]
            assert e.status == moe_ep.ERROR_TIMEOUT, e
            assert out["health"].status == moe_ep.ERROR_TIMEOUT, "a dropped rank's handle is done (sticky)"
            continue
        e = out["failed"]
        assert e.status == moe_ep.ERROR_TIMEOUT, e
        assert f"rank(s) {dead} did not answer" in e.message and "epoch 1" in e.message, e.message
        # Detection takes timeout_ms plus a store round trip (generous bound for a loaded machine).
        assert out["detect_s"] < timeout_ms / 1000 + 5, out["detect_s"]
        h = out["health"]
        assert (h.status, h.error, h.failed_rank, h.active_count, h.mask_epoch) == \
            (moe_ep.SUCCESS, None, dead, world - 1, 1), h
        assert out["mask"] == active
        for got in out["after"]:
            checks.compare(masked, rank, got)
        assert out["final"].mask_epoch == 2, out["final"]


def test_bad_failure_options_are_refused_with_the_message():
    kw = dict(num_experts=2, top_k=1, max_tokens_per_rank=2, hidden_size=4, backend="host", timeout_ms=TIMEOUT_MS)

    def error_of(**extra):
        with pytest.raises(moe_ep.MoeEpError) as e:
            moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **kw, **extra)
        return e.value

    e = error_of(failure_policy="mask")  # no store
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert "config->store_address" in e.message and "NULL" in e.message, e.message
    e = error_of(failure_policy="mask", store_address="nocolon")
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert "config->store_address" in e.message and '"nocolon"' in e.message, e.message
    e = error_of(failure_policy="mask", store_address="127.0.0.1:99999")
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT and "99999" in e.message, e.message
    e = error_of(failure_policy=7, store_address="127.0.0.1:1")
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert "config->failure_policy" in e.message and "7" in e.message, e.message
    e = error_of(rejoin=True)  # rejoin without MASK
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT and "config->failure_policy" in e.message, e.message
    e = error_of(failure_policy="mask", store_address="127.0.0.1:1\0junk")
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT and "store_address" in e.message, e.message
    e = error_of(failure_policy="mask", store_address=1234)
    assert e.status == moe_ep.ERROR_INVALID_ARGUMENT and "store_address" in e.message, e.message
    with pytest.raises(ValueError, match="failure_policy 'maybe'"):
        moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), failure_policy="maybe", **kw)
    with pytest.raises(moe_ep.MoeEpError) as bad:
        moe_ep.StoreBootstrap("nocolon", prefix("bad"), 0, 1, TIMEOUT_MS)
    assert bad.value.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert "address" in bad.value.message and '"nocolon"' in bad.value.message, bad.value.message
    with moe_ep.Store("127.0.0.1", 0) as store:
        address = store.address
        with moe_ep.from_store(address, prefix("one"), 0, 1, TIMEOUT_MS) as bs:
            # A group of one: MASK works, nothing to mask.
            with moe_ep.MoeEp(bs, **kw, failure_policy="mask", store_address=address,
                              store_prefix=prefix("g")) as ep:
                assert ep.poll_health() == moe_ep.Health(moe_ep.SUCCESS, None, -1, 1, 0)
        assert bs.struct.ctx is None, "close() released the store bootstrap"
        bs.close()  # again: a no-op
    with pytest.raises(moe_ep.MoeEpError) as gone:  # the store is closed: nobody listens there
        moe_ep.StoreBootstrap(address, prefix("gone"), 0, 1, TIMEOUT_MS)
    assert gone.value.status == moe_ep.ERROR_BOOTSTRAP and address in gone.value.message, gone.value.message


class StalledPeer:
    """Rank 0 of a group of 2 whose rank 1 never answers: each allgather and
    barrier of rank 0 blocks until release() (then fails), as a dead peer's
    collective would."""

    def __init__(self):
        self.released = threading.Event()
        self.entered = threading.Event()
        self.returned = threading.Event()
        self.answer_first = 0  # calls answered as a group of one would (to get past create)

    def release(self):
        self.released.set()

    def bootstrap(self):
        def allgather(send, recv, nbytes):
            if self.answer_first > 0:
                self.answer_first -= 1
                for r in range(2):
                    ctypes.memmove(recv + r * nbytes, send, nbytes)
                return
            self.entered.set()
            try:
                self.released.wait(60)
                raise RuntimeError("rank 1 never answered")
            finally:
                self.returned.set()

        def barrier():
            allgather(0, 0, 0)

        return moe_ep.CallbackBootstrap(0, 2, allgather, barrier)


def _drop_and_collect(bootstrap):
    ref = weakref.ref(bootstrap)
    del bootstrap
    gc.collect()
    return ref


def test_a_timed_out_create_keeps_the_bootstrap_while_its_callback_runs():
    peer = StalledPeer()
    bs = peer.bootstrap()
    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.MoeEp(bs, num_experts=2, top_k=1, max_tokens_per_rank=2, hidden_size=4, backend="host",
                     timeout_ms=300)
    assert e.value.status == moe_ep.ERROR_TIMEOUT
    assert peer.entered.is_set() and not peer.returned.is_set(), "the callback is still blocked"
    assert bs.abandoned
    ref = _drop_and_collect(bs)
    assert ref() is not None, "the bootstrap (and its ctypes callbacks) outlives the blocked callback"
    peer.release()
    assert peer.returned.wait(10)
    time.sleep(0.05)  # the library's thread leaves the ctypes callback
    gc.collect()
    assert ref() is not None, "kept for the rest of the process: nothing says the library is done with it"


def test_a_timed_out_dispatch_then_destroy_keeps_the_bootstrap_while_its_callback_runs():
    peer = StalledPeer()
    # Rank 1 takes part in create (its answers are rank 0's: the same
    # parameters), then stops: the first exchange of dispatch never completes.
    peer.answer_first = 10 ** 9
    bs = peer.bootstrap()
    ep = moe_ep.MoeEp(bs, num_experts=2, top_k=1, max_tokens_per_rank=2, hidden_size=4, hidden_dtype="float32",
                      combine_dtype="float32", backend="host", timeout_ms=300)
    peer.answer_first = 0
    with pytest.raises(moe_ep.MoeEpError) as e:
        ep.dispatch(np.ones((2, 4), np.float32), np.array([[0], [1]], np.int32))
    assert e.value.status == moe_ep.ERROR_TIMEOUT
    assert peer.entered.is_set() and not peer.returned.is_set()
    ep.destroy()  # broken: releases without waiting for the peer
    del ep
    assert bs.abandoned
    ref = _drop_and_collect(bs)
    assert ref() is not None
    peer.release()
    assert peer.returned.wait(10)
    time.sleep(0.05)
    gc.collect()
    assert ref() is not None


def test_a_store_bootstrap_is_not_released_under_a_blocked_callback():
    """The store bootstrap's callbacks are the library's C functions with a C
    ctx: close() after a timed-out create must not free that ctx while the
    callback still waits in the store (until the store goes away)."""
    store = moe_ep.Store("127.0.0.1", 0)
    try:
        bs = moe_ep.StoreBootstrap(store.address, prefix("stalled"), 0, 2, timeout_ms=30000)
        with pytest.raises(moe_ep.MoeEpError) as e:  # rank 1 never comes
            moe_ep.MoeEp(bs, num_experts=2, top_k=1, max_tokens_per_rank=2, hidden_size=4, backend="host",
                         timeout_ms=300)
        assert e.value.status == moe_ep.ERROR_TIMEOUT
        assert bs.abandoned
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            bs.close()
        assert any(issubclass(w.category, ResourceWarning) and "timed out" in str(w.message) for w in caught), \
            [str(w.message) for w in caught]
        assert bs.struct.ctx is not None, "the C bootstrap is still there for the blocked callback"
    finally:
        store.close()  # the blocked wait answers "not found": the callback returns
    time.sleep(0.2)
