"""The expert receive layouts (receive_layout="expert_major" /
"expert_packed") on the HOST backend, ranks as threads: every result against
the numpy model of docs/semantics.md §4, and combine bitwise equal to the
model and to a rank-major combine of the same weighted, locally reduced rows."""

import os
import re

import numpy as np
import pytest

import moe_ep
from moe_ep import _lib

import layout_checks
from conftest import host_kwargs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


WORLDS = [1, 2, 3]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("index", range(len(layout_checks.SPECS)),
                         ids=[s[0] for s in layout_checks.SPECS])
def test_expert_layouts_against_the_model_and_rank_major(thread_group, world, index):
    _, ep_kwargs, _, how = layout_checks.SPECS[index]
    case = layout_checks.spec_case(index, world)
    models = [layout_checks.layout_model(case, r, ep_kwargs) for r in range(world)]
    zero_copy = how == "zero_copy"

    def rank_fn(rank, bs):
        with moe_ep.MoeEp(bs, **host_kwargs(case, zero_copy_combine=zero_copy, **ep_kwargs)) as ep, \
             moe_ep.MoeEp(bs, **host_kwargs(case)) as rank_major:
            assert ep.receive_layout == ep_kwargs["receive_layout"]
            return layout_checks.run_rank(ep, rank_major, case, rank, models[rank], how)

    for rank, got in enumerate(thread_group(world).run(rank_fn)):
        layout_checks.compare(case, rank, got, models)


def test_the_cases_cover_drops_and_tokens_with_several_rows():
    # The specs with a small capacity or expert_rows drop pairs, the others
    # none, and in each some rank receives a token more than once.
    for index, (name, ep_kwargs, _, _) in enumerate(layout_checks.SPECS):
        bounded = "expert_capacity" in ep_kwargs or "expert_rows" in ep_kwargs
        for world in WORLDS:
            case = layout_checks.spec_case(index, world)
            models = [layout_checks.layout_model(case, r, ep_kwargs) for r in range(world)]
            assert any(m.dropped for m in models) == bounded, (name, world)
            several = [len(t) > len(set(t)) for t in
                       ([tuple(src[:2]) for src in m.sources.tolist() if src[0] >= 0] for m in models)]
            assert any(several), (name, world)


def small(**extra):
    kw = dict(num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3, hidden_dtype="float32",
              combine_dtype="float32", backend="host")
    kw.update(extra)
    return moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **kw)


def test_rank_major_results_have_no_expert_layout_fields():
    x = np.ones((2, 3), np.float32)
    ids = np.array([[0, 1], [2, 3]], np.int32)
    with small() as ep:
        assert ep.receive_layout == "rank_major"
        r = ep.dispatch(x, ids)
        for name in _lib.EXPERT_LAYOUT_RESULT_FIELDS:
            assert getattr(r, name) is None, name
        assert r.topk_ids is not None
        ep.combine(np.zeros((8, 3), np.float32))


def test_layout_names_ints_and_errors():
    assert moe_ep.core.make_params(4, 2, 8, 3, receive_layout="EXPERT_PACKED").receive_layout == 2
    assert moe_ep.core.make_params(4, 2, 8, 3, receive_layout=moe_ep.LAYOUT_EXPERT_MAJOR).receive_layout == 1
    p = moe_ep.core.make_params(4, 2, 8, 3, receive_layout="expert_major", scale_layout="column_major",
                                expert_output_weighted=True, expert_capacity=3)
    assert (p.scale_layout, p.expert_output_weighted, p.expert_capacity) == (1, 1, 3)
    with pytest.raises(ValueError, match="unknown receive_layout 'expert'; expected one of 'rank_major'"):
        small(receive_layout="expert")
    with pytest.raises(ValueError, match="unknown scale_layout 'col'"):
        small(receive_layout="expert_packed", scale_layout="col")
    with pytest.raises(moe_ep.MoeEpError, match="expert_rows: expected an int"):
        small(receive_layout="expert_packed", expert_rows=4.0)
    # The library's own checks, naming the field.
    with pytest.raises(moe_ep.MoeEpError) as e:
        small(expert_capacity=4)  # a field of a layout not chosen
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "expert_capacity" in e.value.message
    with pytest.raises(moe_ep.MoeEpError) as e:
        small(receive_layout="expert_packed", expert_alignment=4, expert_rows=6)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "expert_rows" in e.value.message
    with pytest.raises(moe_ep.MoeEpError) as e:
        small(receive_layout=7)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "receive_layout" in e.value.message


def test_workspace_size_takes_the_layout():
    kw = dict(num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3, backend="host")
    rank_major = moe_ep.workspace_size(2, **kw)
    packed = moe_ep.workspace_size(2, receive_layout="expert_packed", expert_alignment=4, **kw)
    assert packed > rank_major


def test_split_phases_in_an_expert_layout_equal_the_fused_calls():
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((5, 3)).astype(np.float32),
                np.stack([rng.permutation(4)[:2] for _ in range(5)]).astype(np.int32),
                rng.random((5, 2)).astype(np.float32)) for _ in range(2)]
    with small(receive_layout="expert_packed", expert_alignment=2, micro_batches=2) as ep:
        fused = []
        for x, ids, w in batches:
            r = ep.dispatch(x, ids, w)
            fused.append({n: np.from_dlpack(getattr(r, n)).copy() for n in ("hidden_states", "row_sources",
                                                                            "row_weights", "expert_offsets")})
            eo = np.from_dlpack(r.hidden_states).copy()
            fused[-1]["output"] = np.from_dlpack(ep.combine(eo)).copy()
        for slot, (x, ids, w) in enumerate(batches):
            ep.dispatch_send(x, ids, w, slot=slot)
        for slot, f in enumerate(fused):
            r = ep.dispatch_recv(slot=slot)
            for n in ("hidden_states", "row_sources", "row_weights", "expert_offsets"):
                assert np.from_dlpack(getattr(r, n)).tobytes() == f[n].tobytes(), n
            ep.combine_send(np.from_dlpack(r.hidden_states).copy(), slot=slot)
            assert not r.row_sources.valid  # the slot's combine_send ends them
        for slot, f in enumerate(fused):
            assert np.from_dlpack(ep.combine_recv(slot=slot)).tobytes() == f["output"].tobytes()
    # Identity experts, one token per pick: the weighted sum of the token's rows.
    x, ids, w = batches[0]
    np.testing.assert_allclose(fused[0]["output"], x * w.sum(axis=1, keepdims=True), rtol=1e-6)


def _header(prefix):
    with open(os.path.join(REPO, "include", "moe_ep_c.h")) as f:
        return {m.group(1): int(m.group(2)) for m in re.finditer(rf"MOE_EP_{prefix}_(\w+)\s*=\s*(\d+)", f.read())}


@pytest.mark.parametrize("prefix", ["LAYOUT", "SCALES"])
def test_layout_constants_match_the_header_in_every_binding(prefix):
    header = _header(prefix)
    assert header and all(getattr(moe_ep, f"{prefix}_{n}") == v for n, v in header.items())
    with open(os.path.join(REPO, "bindings", "rust", "moe-ep-sys", "src", "lib.rs")) as f:
        rust = {m.group(1): int(m.group(2))
                for m in re.finditer(rf"pub const MOE_EP_{prefix}_(\w+): i32 = (\d+);", f.read())}
    with open(os.path.join(REPO, "bindings", "julia", "MoeEp", "src", "MoeEp.jl")) as f:
        julia = {m.group(1): int(m.group(2)) for m in re.finditer(rf"const {prefix}_(\w+) = Int32\((\d+)\)", f.read())}
    assert rust == header
    assert julia == header
