"""The HOST backend under mpirun with the mpi4py bootstrap (libmoe_ep_mpi).

Run as: mpiexec -n N python -m pytest bindings/python/tests/test_mpi.py
Every rank runs the same tests in the same order; assertions come after each
test's collective calls (see checks.py)."""

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI")

import moe_ep  # noqa: E402

import checks  # noqa: E402
import layout_checks  # noqa: E402
import reference  # noqa: E402
from conftest import host_kwargs  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, WORLD = COMM.Get_rank(), COMM.Get_size()


@pytest.fixture(scope="module")
def bootstrap():
    bs = moe_ep.from_mpi4py(COMM)
    yield bs
    bs.close()


def test_bootstrap_reflects_the_communicator(bootstrap):
    assert (bootstrap.rank, bootstrap.world_size) == (RANK, WORLD)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("combine_dtype", [np.float32, np.float16])
def test_random_cases_against_numpy_reference(bootstrap, seed, combine_dtype):
    case = reference.Case(seed=seed, world=WORLD, num_experts=3 * WORLD, top_k=min(3, 3 * WORLD), hidden=9,
                          tokens_per_rank=7, max_tokens_per_rank=11, scale_elems=seed % 2 * 2,
                          combine_dtype=combine_dtype, zero_rank=seed % WORLD if seed else None,
                          with_weights=seed != 2)
    with moe_ep.MoeEp(bootstrap, **host_kwargs(case, enable_eplb_stats=True)) as ep:
        got = checks.run_rank(ep, case, RANK, runtime_tpr=case.tpr, out_buffer=seed == 1,
                              expert_output_3d=seed == 2)
    checks.compare(case, RANK, got, eplb=True)


def test_several_rounds_on_one_handle(bootstrap):
    cases = [reference.Case(seed=100 + i, world=WORLD, num_experts=2 * WORLD, top_k=2, hidden=4,
                            tokens_per_rank=5) for i in range(4)]
    with moe_ep.MoeEp(bootstrap, **host_kwargs(cases[0])) as ep:
        results = [checks.run_rank(ep, c, RANK) for c in cases]
    for c, got in zip(cases, results):
        checks.compare(c, RANK, got)


def test_two_micro_batches_in_flight_equal_the_fused_calls(bootstrap):
    cases = [reference.Case(seed=200 + i, world=WORLD, num_experts=2 * WORLD, top_k=2, hidden=4,
                            tokens_per_rank=5, scale_elems=1) for i in range(2)]
    with moe_ep.MoeEp(bootstrap, **host_kwargs(cases[0], micro_batches=2)) as ep:
        fused = [checks.run_rank(ep, c, RANK) for c in cases]
        for slot, c in enumerate(cases):
            inp = c.inputs[RANK]
            ep.dispatch_send(inp["x"], inp["ids"], inp["w"], inp["scale"], slot=slot)
        split = []
        for slot, c in enumerate(cases):
            r = ep.dispatch_recv(slot=slot)
            split.append({n: np.from_dlpack(getattr(r, n)).copy()
                          for n in ("hidden_states", "topk_ids", "topk_weights", "recv_counts")})
            ep.combine_send(c.expert_output(RANK), slot=slot)
        for slot, got in enumerate(split):
            got["output"] = np.from_dlpack(ep.combine_recv(slot=slot)).copy()
    for c, f, g in zip(cases, fused, split):
        checks.compare(c, RANK, f)
        for name, value in g.items():
            assert value.tobytes() == f[name].tobytes(), name


@pytest.mark.parametrize("index", range(len(layout_checks.SPECS)), ids=[s[0] for s in layout_checks.SPECS])
def test_expert_layouts_against_the_model_and_rank_major(bootstrap, index):
    _, ep_kwargs, _, how = layout_checks.SPECS[index]
    case = layout_checks.spec_case(index, WORLD)
    models = [layout_checks.layout_model(case, r, ep_kwargs) for r in range(WORLD)]
    with moe_ep.MoeEp(bootstrap, **host_kwargs(case, zero_copy_combine=how == "zero_copy", **ep_kwargs)) as ep, \
         moe_ep.MoeEp(bootstrap, **host_kwargs(case)) as rank_major:
        got = layout_checks.run_rank(ep, rank_major, case, RANK, models[RANK], how)
    layout_checks.compare(case, RANK, got, models)


def test_bad_ids_reported_on_the_rank_that_sent_them(bootstrap):
    case = reference.Case(seed=7, world=WORLD, num_experts=2 * WORLD, top_k=2, hidden=4, tokens_per_rank=5)
    bad_rank = WORLD - 1
    # Every rank applies the same change to its copy of the inputs, so the
    # model (which drops ids outside [0, E)) knows what bad_rank really sent.
    bad_ids = case.inputs[bad_rank]["ids"]
    sent_bad = bad_ids.shape[0] > 0
    if sent_bad:
        bad_ids[0, 0] = 1000
    with moe_ep.MoeEp(bootstrap, **host_kwargs(case)) as ep:
        got = checks.run_rank(ep, case, RANK)
        err = ep.async_error()
    checks.compare(case, RANK, got)
    if RANK == bad_rank and sent_bad:
        assert err is not None and err.status == moe_ep.ERROR_INVALID_INPUT and "1000" in err.message
    else:
        assert err is None


def test_health_and_the_last_rank_inactive(bootstrap):
    """The poll and the mask through the MPI adapter: the last rank inactive
    (with more than one rank), results those of the masked model."""
    case = reference.Case(seed=9, world=WORLD, num_experts=2 * WORLD, top_k=2, hidden=4, tokens_per_rank=5)
    active = [r != WORLD - 1 or WORLD == 1 for r in range(WORLD)]
    masked = case.masked(active)
    with moe_ep.MoeEp(bootstrap, **host_kwargs(case)) as ep:
        healthy = ep.poll_health()
        ep.set_active_ranks(active)
        health, mask = ep.poll_health(), ep.active_ranks()
        got = checks.run_rank(ep, masked, RANK, inputs=case.inputs[RANK])
    assert (healthy.status, healthy.error, healthy.failed_rank, healthy.active_count, healthy.mask_epoch) == \
        (moe_ep.SUCCESS, None, -1, WORLD, 0)
    assert (health.active_count, health.mask_epoch, mask) == (sum(active), 1, active)
    checks.compare(masked, RANK, got)


def test_mpi_bootstrap_close_is_idempotent():
    bs = moe_ep.from_mpi4py(COMM)
    assert bs.world_size == WORLD
    bs.close()
    bs.close()
