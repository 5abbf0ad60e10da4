"""The health poll and the active-rank mask (docs/semantics.md, "Active ranks";
docs/reliability.md, "The health poll") on the HOST backend, ranks as
threads: a healthy poll, a mask set and read back, dispatch and combine under
the mask against the numpy model of the masked routing, and bad masks refused
on every rank with the library's message."""

import ctypes

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
