"""The expert receive layouts through the Python API: run one rank's share of
a reference.Case on an expert-layout handle and on a rank-major one, then
compare both with reference.ExpertLayout (see checks.py for why the
collective calls and the assertions are kept apart)."""

import numpy as np

import reference

RESULTS = ("hidden_states", "topk_ids", "topk_weights", "hidden_states_scale", "recv_counts",
           "local_expert_counts", "expert_counts", "expert_offsets", "row_sources", "row_weights",
           "dropped_pairs")

# (name, MoeEp keyword arguments beyond the case's, Case arguments, how combine is called)
SPECS = [
    ("packed_align4_scales", dict(receive_layout="expert_packed", expert_alignment=4),
     dict(scale_elems=2), "plain"),
    ("packed_bounded_rows_fp16_no_weights", dict(receive_layout="expert_packed", expert_alignment=2, expert_rows=4),
     dict(combine_dtype=np.float16, with_weights=False), "plain"),
    ("packed_column_major_weighted", dict(receive_layout="expert_packed", expert_alignment=8,
                                          scale_layout="column_major", expert_output_weighted=True),
     dict(scale_elems=3), "zero_copy"),
    ("major_default_column_major", dict(receive_layout="expert_major", scale_layout="column_major"),
     dict(scale_elems=2), "zero_copy"),
    ("major_capacity2_fp16_weighted", dict(receive_layout="expert_major", expert_capacity=2,
                                           expert_output_weighted=True),
     dict(combine_dtype=np.float16), "flat"),
]


def layout_model(case, rank, ep_kwargs):
    return reference.ExpertLayout(case, rank, ep_kwargs["receive_layout"],
                                  capacity=ep_kwargs.get("expert_capacity", 0),
                                  alignment=ep_kwargs.get("expert_alignment", 0),
                                  expert_rows=ep_kwargs.get("expert_rows", 0),
                                  scale_layout=ep_kwargs.get("scale_layout", "row_major"),
                                  weighted=ep_kwargs.get("expert_output_weighted", False))


def _host_copy(view):
    return np.from_dlpack(view).copy()


def _as_is(array):
    return array


def run_rank(ep, rank_major_ep, case, rank, model, how="plain", to_numpy=_host_copy, to_input=_as_is):
    """Collective: dispatch and combine on the expert-layout handle `ep`, then
    the same tokens on `rank_major_ep`, whose expert output is the model's
    per-rank partial sums (the weighted, locally reduced rows a rank-major
    user computes).  Returns the copied results.  to_numpy copies a result
    view into a numpy array, to_input makes a numpy array an input of the
    handle's device (the defaults: host views and numpy inputs)."""
    inp = {k: None if v is None else to_input(v) for k, v in case.inputs[rank].items()}
    r = ep.dispatch(inp["x"], inp["ids"], inp["w"], inp["scale"])
    got = {"tokens_per_rank": r.tokens_per_rank, "valid_before": r.row_sources.valid}
    for name in RESULTS:
        v = getattr(r, name)
        got[name] = None if v is None else to_numpy(v)
    # The experts compute from the rows the library handed out.
    eo = model.expert_output(got["hidden_states"].reshape(model.rows, case.H))
    got["expert_output"] = eo
    if how == "zero_copy":
        got["combine_input_shape"] = r.combine_input.shape
        r.combine_input.write(eo.reshape(r.combine_input.shape))
        y = ep.combine(r.combine_input)
    elif how == "flat":
        y = ep.combine(to_input(eo))  # EXPERT_MAJOR also takes [El * capacity, H]
    else:
        y = ep.combine(to_input(np.ascontiguousarray(eo.reshape(model.shape(case.H)))))
    got["output"] = to_numpy(y)
    got["valid_after"] = r.row_sources.valid
    # Rank-major: the same tokens, the expert output the partial sums.
    rm = rank_major_ep.dispatch(inp["x"], inp["ids"], inp["w"], inp["scale"])
    tpr = rm.tokens_per_rank
    counts = to_numpy(rm.recv_counts)
    parts = model.partials(eo)
    rm_eo = np.full((case.world * tpr, case.H), np.nan, case.combine_dtype)
    for s in range(case.world):
        sel = np.nonzero(case.goes_to(case.inputs[s]["ids"], rank))[0]
        for j, t in enumerate(sel[:counts[s]]):
            rm_eo[s * tpr + j] = parts[(s, int(t))]
    got["rank_major_output"] = to_numpy(rank_major_ep.combine(to_input(rm_eo)))
    return got


def compare(case, rank, got, models):
    """models: every rank's reference.ExpertLayout (the combine needs them all)."""
    m = models[rank]
    rows, S = m.rows, case.scale_elems
    assert got["tokens_per_rank"] == case.max_tpr
    assert got["topk_ids"] is None and got["topk_weights"] is None
    assert got["hidden_states"].shape == m.shape(case.H)
    np.testing.assert_array_equal(got["expert_counts"], m.counts)
    np.testing.assert_array_equal(got["local_expert_counts"], m.received)
    if m.layout == "expert_packed":
        np.testing.assert_array_equal(got["expert_offsets"], m.offsets)
    else:
        assert got["expert_offsets"] is None
    np.testing.assert_array_equal(got["row_sources"], m.sources)
    np.testing.assert_array_equal(got["row_weights"], m.weights)
    np.testing.assert_array_equal(got["dropped_pairs"], [m.dropped])
    np.testing.assert_array_equal(got["recv_counts"], case.dispatch(rank)["recv_counts"])
    written = m.expert_of_row >= 0  # padding payload and scales are unspecified
    np.testing.assert_array_equal(got["hidden_states"].reshape(rows, case.H)[written], m.hidden_rows()[written])
    if S:
        np.testing.assert_array_equal(m.scales_from_result(got["hidden_states_scale"])[written],
                                      m.scale_rows()[written])
    else:
        assert got["hidden_states_scale"] is None
    if "combine_input_shape" in got:
        assert got["combine_input_shape"] == m.shape(case.H)
    assert got["valid_before"] and not got["valid_after"]
    y = got["output"]
    assert y.dtype == case.combine_dtype and y.shape == (case.inputs[rank]["x"].shape[0], case.H)
    np.testing.assert_array_equal(y, reference.expert_layout_combine(models, rank))
    np.testing.assert_array_equal(y, got["rank_major_output"])


def spec_case(index, world):
    """The Case of SPECS[index] on `world` ranks; the seeds are chosen so that
    test_the_cases_cover_drops_and_tokens_with_several_rows holds."""
    return reference.Case(seed=90 + 10 * index + world, world=world, num_experts=3 * world, top_k=3, hidden=5,
                          tokens_per_rank=8, max_tokens_per_rank=9, zero_rank=world - 1 if world > 1 else None,
                          **SPECS[index][2])
