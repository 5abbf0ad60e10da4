"""The split calls (dispatch_send/dispatch_recv/combine_send/combine_recv) on
the HOST backend: the same bits as the fused calls, two micro-batches in
flight on one handle, the per-slot state machine, and the views' lifetimes."""

import numpy as np
import pytest

import moe_ep

import checks
import reference
from conftest import host_kwargs

FIELDS = ("hidden_states", "topk_ids", "topk_weights", "hidden_states_scale", "recv_counts",
          "local_expert_counts", "eplb_gathered_stats")


def copy_dispatch(r):
    got = {"tokens_per_rank": r.tokens_per_rank}
    for name in FIELDS:
        v = getattr(r, name)
        got[name] = None if v is None else np.from_dlpack(v).copy()
    return got


def send(ep, case, rank, slot):
    inp = case.inputs[rank]
    assert ep.dispatch_send(inp["x"], inp["ids"], inp["w"], inp["scale"], slot=slot) is None


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if a[k] is None or b[k] is None or not isinstance(a[k], np.ndarray):
            assert a[k] is b[k] or a[k] == b[k], k
        else:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert a[k].tobytes() == b[k].tobytes(), k


def cases(world):
    # Two micro-batches of one handle: the same sizes, different tokens.
    return [reference.Case(seed=40 + i, world=world, num_experts=2 * world, top_k=2, hidden=5, tokens_per_rank=6,
                           scale_elems=2, zero_rank=(world - 1 if i else None)) for i in range(2)]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_split_equals_fused_on_each_slot(thread_group, world):
    case = cases(world)[0]

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case, enable_eplb_stats=True, micro_batches=2)) as ep:
            fused = checks.run_rank(ep, case, rank)
            split = []
            for slot in (0, 1):
                send(ep, case, rank, slot)
                got = copy_dispatch(ep.dispatch_recv(slot=slot))
                assert ep.combine_send(case.expert_output(rank), slot=slot) is None
                got["output"] = np.from_dlpack(ep.combine_recv(slot=slot)).copy()
                split.append(got)
            return fused, split

    for rank, (fused, split) in enumerate(thread_group(world).run(rank_fn)):
        checks.compare(case, rank, fused, eplb=True)
        for got in split:
            assert_same(got, fused)


@pytest.mark.parametrize("zero_copy", [False, True])
def test_two_micro_batches_interleaved_equal_fused(thread_group, zero_copy):
    world = 2
    a, b = cases(world)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(a, zero_copy_combine=zero_copy)) as fused_ep:
            fused = [checks.run_rank(fused_ep, c, rank, zero_copy=zero_copy) for c in (a, b)]
        with moe_ep.MoeEp(bs, **host_kwargs(a, zero_copy_combine=zero_copy, micro_batches=2)) as ep:
            send(ep, a, rank, 0)
            send(ep, b, rank, 1)
            ra = ep.dispatch_recv(slot=0)
            rb = ep.dispatch_recv(slot=1)
            got = [copy_dispatch(ra), copy_dispatch(rb)]
            eo = []
            for r, c in ((ra, a), (rb, b)):
                e = c.expert_output(rank)
                if zero_copy:
                    r.combine_input.write(e)
                    e = r.combine_input
                eo.append(e)
            ep.combine_send(eo[0], slot=0)
            # Slot 0's views expired with its combine_send; slot 1's did not.
            expired_a, valid_b = not ra.hidden_states.valid, rb.hidden_states.valid
            valid_b_bits = np.from_dlpack(rb.topk_ids).tobytes() == got[1]["topk_ids"].tobytes()
            ep.combine_send(eo[1], slot=1)
            ya = ep.combine_recv(slot=0)
            out_b = np.full((b.inputs[rank]["x"].shape[0], b.H), 7, dtype=b.combine_dtype)
            yb = ep.combine_recv(slot=1, output=out_b)
            # Another slot's combine_recv leaves slot 0's library-owned output alone.
            got[0]["output"] = np.from_dlpack(ya).copy()
            got[1]["output"] = yb.copy()
            states = (expired_a, valid_b, valid_b_bits, not rb.hidden_states.valid, ya.valid, yb is out_b)
        return fused, got, states

    for rank, (fused, got, states) in enumerate(thread_group(world).run(rank_fn)):
        assert states == (True, True, True, True, True, True)
        for f, g, c in zip(fused, got, (a, b)):
            checks.compare(c, rank, g)
            assert_same(g, f)


def small_ep(**extra):
    kw = dict(num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3, hidden_dtype="float32",
              combine_dtype="float32", backend="host", micro_batches=2)
    kw.update(extra)
    return moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **kw)


def inputs(T=5, offset=0):
    x = np.arange(T * 3, dtype=np.float32).reshape(T, 3) + offset
    ids = np.array([[0, 1], [2, -1], [3, 3], [-1, -1], [1, 2], [0, 0], [1, 1], [2, 2]][:T], dtype=np.int32)
    w = np.full((T, 2), 0.5, np.float32)
    return x, ids, w


def expected(x):
    # Identity experts: each sent token comes back once, token 3 (no pick) as zeros.
    return np.where(np.arange(x.shape[0])[:, None] == 3, 0, x)


def raises(status, fn, *args, **kw):
    with pytest.raises(moe_ep.MoeEpError) as e:
        fn(*args, **kw)
    assert e.value.status == status, (e.value.status, e.value.message)
    return e.value.message


def test_misuse_is_invalid_state_and_keeps_the_handle_usable():
    x, ids, w = inputs()
    S = moe_ep.ERROR_INVALID_STATE
    with small_ep() as ep:
        raises(S, ep.dispatch_recv, slot=0)
        raises(S, ep.combine_send, np.zeros((8, 3), np.float32), slot=1)
        raises(S, ep.combine_recv, slot=0)
        ep.dispatch_send(x, ids, w, slot=0)
        raises(S, ep.dispatch_send, x, ids, w, slot=0)
        raises(S, ep.dispatch, x, ids, w)  # the fused calls run on slot 0
        raises(S, ep.combine_send, np.zeros((8, 3), np.float32), slot=0)
        r = ep.dispatch_recv(slot=0)
        raises(S, ep.dispatch_recv, slot=0)
        raises(S, ep.combine_recv, slot=0)
        # Refused calls expired nothing.
        assert r.hidden_states.valid
        rows = np.from_dlpack(r.hidden_states).copy()
        ep.combine_send(rows, slot=0)
        raises(S, ep.combine_send, rows, slot=0)
        raises(S, ep.combine, rows)
        raises(S, ep.dispatch_send, x, ids, w, slot=0)
        y = np.from_dlpack(ep.combine_recv(slot=0)).copy()
        np.testing.assert_array_equal(y, expected(x))
        # Back to IDLE: the fused calls work again.
        r = ep.dispatch(x, ids, w)
        np.testing.assert_array_equal(np.from_dlpack(ep.combine(r.hidden_states)), expected(x))


def test_bad_slots_name_the_argument():
    x, ids, w = inputs()
    A = moe_ep.ERROR_INVALID_ARGUMENT
    with small_ep() as ep:
        assert "slot" in raises(A, ep.dispatch_send, x, ids, w, slot=2)
        assert "slot" in raises(A, ep.dispatch_recv, slot=-1)
        assert "slot" in raises(A, ep.dispatch_send, x, ids, w, slot="1")
        assert "slot" in raises(A, ep.dispatch_send, x, ids, w, slot=2**40)
    with small_ep(micro_batches=1) as one:
        assert "slot" in raises(A, one.dispatch_send, x, ids, w, slot=1)
        one.dispatch_send(x, ids, w)
        r = one.dispatch_recv()
        one.combine_send(r.hidden_states)
        np.testing.assert_array_equal(np.from_dlpack(one.combine_recv()), expected(x))
    assert "micro_batches" in raises(A, small_ep, micro_batches=3)


def test_expired_views_raise():
    S = moe_ep.ERROR_INVALID_STATE
    with small_ep() as ep:
        outs = []
        for round_ in range(2):
            for slot in (0, 1):
                x, ids, w = inputs(offset=10 * slot + 100 * round_)
                ep.dispatch_send(x, ids, w, slot=slot)
                r = ep.dispatch_recv(slot=slot)
                ep.combine_send(r.hidden_states, slot=slot)
                assert not r.hidden_states.valid and not r.recv_counts.valid
                assert "slot" in raises(S, np.from_dlpack, r.hidden_states)
                raises(S, ep.combine_send, r.topk_weights, slot=slot)  # not passable either
                y = ep.combine_recv(slot=slot)
                np.testing.assert_array_equal(np.from_dlpack(y), expected(x))
                outs.append(y)
            if round_ == 0:
                # Each slot's library-owned output lives until that slot's next combine_recv.
                assert outs[0].valid and outs[1].valid
        assert not outs[0].valid and not outs[1].valid and outs[2].valid and outs[3].valid
        assert "slot 0" in raises(S, np.from_dlpack, outs[0])
        # The fused combine is slot 0's: it expires slot 0's output, not slot 1's.
        r = ep.dispatch(*inputs())
        ep.combine(r.hidden_states)
        assert not outs[2].valid and outs[3].valid
    assert not outs[3].valid  # destroyed
