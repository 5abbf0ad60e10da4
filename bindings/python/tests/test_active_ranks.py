"""The health poll and the active-rank mask (docs/semantics.md, "Active ranks";
docs/reliability.md, "The health poll") on the HOST backend, ranks as
threads: a healthy poll, a mask set and read back, dispatch and combine under
the mask against the numpy model of the masked routing, and bad masks refused
on every rank with the library's message."""

import ctypes
import threading
import time

import numpy as np
import pytest

import moe_ep
from moe_ep import _lib

import checks
import reference
from conftest import host_kwargs


def test_health_init_fills_struct_size_and_no_failed_rank():
    h = _lib.Health()
    assert _lib.lib().moe_ep_health_init(ctypes.byref(h), ctypes.sizeof(h)) == moe_ep.SUCCESS
    assert (h.struct_size, h.status, h.failed_rank, h.active_count, h.mask_epoch) == (ctypes.sizeof(h), 0, -1, 0, 0)
    assert _lib.lib().moe_ep_health_init(ctypes.byref(h), 3) == moe_ep.ERROR_INVALID_ARGUMENT
    assert "health" in _lib.lib().moe_ep_last_error().decode()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_poll_health_of_a_healthy_handle(thread_group, world):
    case = reference.Case(seed=60 + world, world=world, num_experts=2 * world, top_k=2, hidden=3, tokens_per_rank=4)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case)) as ep:
            before = ep.poll_health(), ep.active_ranks()
            got = checks.run_rank(ep, case, rank)
            after = ep.poll_health()
            # All-active again: accepted, and it still counts as an update.
            ep.set_active_ranks([True] * world)
            return before, got, after, ep.poll_health(), ep.active_ranks()

    for rank, (before, got, after, again, mask) in enumerate(thread_group(world).run(rank_fn)):
        health, mask0 = before
        assert isinstance(health, moe_ep.Health)
        assert (health.status, health.error, health.failed_rank) == (moe_ep.SUCCESS, None, -1)
        assert (health.active_count, health.mask_epoch) == (world, 0)
        assert mask0 == [True] * world
        assert after == health, "a dispatch/combine pair changes nothing the poll reports"
        assert (again.active_count, again.mask_epoch, again.error) == (world, 1, None)
        assert mask == [True] * world
        checks.compare(case, rank, got)


@pytest.mark.parametrize("world,inactive", [(2, 1), (3, 1), (3, 0), (4, 3)])
def test_one_rank_inactive_matches_the_masked_model(thread_group, world, inactive):
    case = reference.Case(seed=70 + 4 * world + inactive, world=world, num_experts=2 * world, top_k=3, hidden=5,
                          tokens_per_rank=6, scale_elems=2)
    active = [r != inactive for r in range(world)]
    masked = case.masked(active)
    # The mask must matter: some pick of the case reaches the inactive rank.
    assert any((case.owner(inp["ids"]) == inactive).any() for inp in case.inputs)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case, enable_eplb_stats=True)) as ep:
            ep.set_active_ranks(np.array(active, np.uint8))  # a numpy mask works too
            health, mask = ep.poll_health(), ep.active_ranks()
            under_mask = [checks.run_rank(ep, masked, rank, inputs=case.inputs[rank], expert_output_3d=i == 1)
                          for i in range(2)]  # the mask stays for every later pair
            ep.set_active_ranks([True] * world)
            restored = checks.run_rank(ep, case, rank)
            return health, mask, under_mask, restored, ep.poll_health()

    for rank, (health, mask, under_mask, restored, final) in enumerate(thread_group(world).run(rank_fn)):
        assert (health.status, health.error, health.failed_rank) == (moe_ep.SUCCESS, None, -1)
        assert (health.active_count, health.mask_epoch) == (world - 1, 1)
        assert mask == active
        for got in under_mask:
            checks.compare(masked, rank, got, eplb=True)
        if rank == inactive:
            got = under_mask[0]
            assert not got["recv_counts"].any() and not got["local_expert_counts"].any()
            assert not got["output"].any(), "an inactive rank's combine output is zeros"
        checks.compare(case, rank, restored, eplb=True)
        assert (final.active_count, final.mask_epoch) == (world, 2)


def test_bad_masks_are_refused_on_every_rank_with_the_message(thread_group):
    world = 2
    case = reference.Case(seed=80, world=world, num_experts=4, top_k=2, hidden=3, tokens_per_rank=4)

    def expect_error(fn):
        try:
            fn()
        except moe_ep.MoeEpError as e:
            return e
        return None

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case)) as ep:
            errors = {
                "too_long": expect_error(lambda: ep.set_active_ranks([True] * (world + 1))),
                "too_short": expect_error(lambda: ep.set_active_ranks([True])),
                "none_active": expect_error(lambda: ep.set_active_ranks([False] * world)),
                # Rank 1 disagrees: both ranks fail, naming it.
                "disagree": expect_error(lambda: ep.set_active_ranks([True, rank == 0])),
                "not_a_sequence": expect_error(lambda: ep.set_active_ranks(3)),
            }
            # Between dispatch and combine: refused, nothing done.
            inp = case.inputs[rank]
            ep.dispatch(inp["x"], inp["ids"], inp["w"])
            errors["in_flight"] = expect_error(lambda: ep.set_active_ranks([True, False]))
            ep.combine(case.expert_output(rank))
            health = ep.poll_health()
            # The refusals left the handle usable and its mask as it was.
            got = checks.run_rank(ep, case, rank)
            return errors, health, ep.active_ranks(), got

    for rank, (errors, health, mask, got) in enumerate(thread_group(world).run(rank_fn)):
        for name in ("too_long", "too_short"):
            e = errors[name]
            assert e is not None and e.status == moe_ep.ERROR_INVALID_ARGUMENT, (name, e)
            # The argument, the expected and the actual value.
            assert "world_size" in e.message and "2" in e.message, e.message
            assert str(world + 1 if name == "too_long" else 1) in e.message, e.message
        e = errors["none_active"]
        assert e is not None and e.status == moe_ep.ERROR_INVALID_ARGUMENT and "active" in e.message, e
        e = errors["disagree"]
        assert e is not None and e.status == moe_ep.ERROR_INVALID_ARGUMENT and "rank 1" in e.message, e
        e = errors["not_a_sequence"]
        assert e is not None and e.status == moe_ep.ERROR_INVALID_ARGUMENT and "active" in e.message, e
        e = errors["in_flight"]
        assert e is not None and e.status == moe_ep.ERROR_INVALID_STATE and "slot 0" in e.message, e
        assert (health.status, health.active_count, health.mask_epoch) == (moe_ep.SUCCESS, world, 0)
        assert mask == [True] * world
        checks.compare(case, rank, got)


def test_calls_on_a_destroyed_handle_raise_invalid_state():
    ep = moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), num_experts=2, top_k=1, max_tokens_per_rank=4, hidden_size=3,
                      backend="host")
    ep.destroy()
    for call in (ep.poll_health, ep.active_ranks, lambda: ep.set_active_ranks([True])):
        with pytest.raises(moe_ep.MoeEpError) as e:
            call()
        assert e.value.status == moe_ep.ERROR_INVALID_STATE


class TwoRanks:
    """Two ranks of one process whose exchange a test can abandon: each
    allgather/barrier waits for the other rank's matching call (by count),
    until `abandon()` makes every waiting and later call fail."""

    def __init__(self):
        self._cond = threading.Condition()
        self._slots = {}
        self._calls = [0, 0]
        self._abandoned = False

    def abandon(self):
        with self._cond:
            self._abandoned = True
            self._cond.notify_all()

    def _meet(self, rank, data):
        with self._cond:
            n = self._calls[rank]
            self._calls[rank] += 1
            self._slots[(n, rank)] = data
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._abandoned or (n, 1 - rank) in self._slots, timeout=60)
            if self._abandoned or (n, 1 - rank) not in self._slots:
                raise RuntimeError(f"rank {1 - rank} is gone")
            return [self._slots[(n, r)] for r in (0, 1)]

    def bootstrap(self, rank):
        def allgather(send, recv, nbytes):
            for r, data in enumerate(self._meet(rank, ctypes.string_at(send, nbytes) if nbytes else b"")):
                ctypes.memmove(recv + r * nbytes, data, nbytes)

        return moe_ep.CallbackBootstrap(rank, 2, allgather, lambda: self._meet(rank, b""))


def test_poll_health_reports_a_sticky_timeout_with_its_message():
    """Rank 1 stops calling after create (as a dead peer would): rank 0's
    dispatch times out, and its poll reports TIMEOUT with the call's message at
    once, without waiting for the stalled exchange, sticky; the mask is then
    refused with the same status."""
    group = TwoRanks()
    handles = [None, None]

    def create(rank):
        handles[rank] = moe_ep.MoeEp(group.bootstrap(rank), num_experts=2, top_k=1, max_tokens_per_rank=4,
                                     hidden_size=3, hidden_dtype="float32", combine_dtype="float32",
                                     backend="host", timeout_ms=300)

    threads = [threading.Thread(target=create, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ep, dead = handles
    assert ep is not None and dead is not None
    try:
        assert ep.poll_health().error is None
        with pytest.raises(moe_ep.MoeEpError) as timed_out:
            ep.dispatch(np.ones((2, 3), np.float32), np.array([[0], [1]], np.int32))
        assert timed_out.value.status == moe_ep.ERROR_TIMEOUT
        start = time.monotonic()
        health = ep.poll_health()
        elapsed = time.monotonic() - start
        # The stalled exchange would hold it for 60 s; a loaded machine may add milliseconds.
        assert elapsed < 1.0, f"the poll took {elapsed:.3f} s"
        assert (health.status, health.failed_rank, health.active_count, health.mask_epoch) == \
            (moe_ep.ERROR_TIMEOUT, -1, 2, 0)
        assert isinstance(health.error, moe_ep.MoeEpError) and health.error.status == moe_ep.ERROR_TIMEOUT
        assert health.error.message == timed_out.value.message
        again = ep.poll_health()
        assert again._replace(error=None) == health._replace(error=None), "sticky"
        assert (again.error.status, again.error.message) == (health.error.status, health.error.message)
        with pytest.raises(moe_ep.MoeEpError) as refused:
            ep.set_active_ranks([True, False])
        assert refused.value.status == moe_ep.ERROR_TIMEOUT
    finally:
        group.abandon()  # frees rank 0's stalled exchange
        ep.destroy()  # broken: releases without waiting for the peer
        dead.destroy()  # completes whatever its peer did
