"""Multi-rank HOST backend in one process: each rank is a thread with a
Python CallbackBootstrap (the same path the torch.distributed bootstrap
takes).  No MPI needed."""

import numpy as np
import pytest

import moe_ep

import checks
import reference
from conftest import host_kwargs


@pytest.mark.parametrize("world,seed,combine_dtype", [(2, 1, np.float32), (3, 2, np.float16), (4, 3, np.float32)])
def test_random_cases_against_numpy_reference(thread_group, world, seed, combine_dtype):
    case = reference.Case(seed=seed, world=world, num_experts=4 * world, top_k=3, hidden=7, tokens_per_rank=6,
                          scale_elems=3, combine_dtype=combine_dtype, zero_rank=world - 1)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case, enable_eplb_stats=True)) as ep:
            return checks.run_rank(ep, case, rank, expert_output_3d=(rank % 2 == 1))

    for rank, got in enumerate(thread_group(world).run(rank_fn)):
        checks.compare(case, rank, got, eplb=True)


def test_runtime_tokens_per_rank_and_two_handles(thread_group):
    """Two handles on one group at once, one of them with a runtime
    tokens_per_rank below its maximum."""
    a = reference.Case(seed=5, world=2, num_experts=4, top_k=2, hidden=3, tokens_per_rank=4, max_tokens_per_rank=9)
    b = reference.Case(seed=6, world=2, num_experts=2, top_k=1, hidden=5, tokens_per_rank=5, with_weights=False)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(a)) as ea, moe_ep.MoeEp(bs, **host_kwargs(b)) as eb:
            ra = checks.run_rank(ea, a, rank, runtime_tpr=4)
            rb = checks.run_rank(eb, b, rank, out_buffer=True)
            return ra, rb

    for rank, (ra, rb) in enumerate(thread_group(2).run(rank_fn)):
        checks.compare(a, rank, ra)
        checks.compare(b, rank, rb)
        assert rb["combine_returned_buffer"]


def test_parameter_mismatch_fails_on_every_rank(thread_group):
    def rank_fn(rank, bs):
        try:
            moe_ep.MoeEp(bs, num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3 + rank, backend="host")
        except moe_ep.MoeEpError as e:
            return e
        return None

    errors = thread_group(2).run(rank_fn)
    for e in errors:
        assert isinstance(e, moe_ep.MoeEpError) and e.status == moe_ep.ERROR_INVALID_ARGUMENT
        assert "hidden_size" in e.message


@pytest.mark.parametrize("world", [1, 2, 3])
def test_zero_copy_combine_input(thread_group, world):
    """zero_copy_combine: the expert output written into DispatchResult.combine_input
    and passed back combines bitwise like the reference (= like a copy); without
    the flag the view is absent."""
    case = reference.Case(seed=40 + world, world=world, num_experts=2 * world, top_k=2, hidden=5,
                          tokens_per_rank=4, combine_dtype=np.float32)

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case, zero_copy_combine=True)) as ep:
            zero_copy = checks.run_rank(ep, case, rank, zero_copy=True)
            copied = checks.run_rank(ep, case, rank)
        with moe_ep.MoeEp(bs, **host_kwargs(case)) as plain:
            inp = case.inputs[rank]
            r = plain.dispatch(inp["x"], inp["ids"], inp["w"], inp["scale"])
            absent = r.combine_input is None
            plain.combine(case.expert_output(rank))
        return zero_copy, copied, absent

    for rank, (zero_copy, copied, absent) in enumerate(thread_group(world).run(rank_fn)):
        checks.compare(case, rank, zero_copy)
        np.testing.assert_array_equal(zero_copy["output"], copied["output"])
        assert absent
