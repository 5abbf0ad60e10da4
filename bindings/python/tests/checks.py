"""Run one rank's share of a reference.Case through a handle, then compare.

Collective calls and assertions are kept apart: run_rank() makes every
collective call and only copies results out; compare() asserts afterwards.
Under mpirun this keeps the ranks' call sequences in step even when one
rank's comparison fails."""

import numpy as np


def run_rank(ep, case, rank, runtime_tpr=0, eplb_local=None, out_buffer=False, expert_output_3d=False,
             zero_copy=False, inputs=None):
    """`inputs`: what the rank sends, default case.inputs[rank] (under an
    active-rank mask: the unmasked inputs, with `case` the masked model)."""
    inp = case.inputs[rank] if inputs is None else inputs
    r = ep.dispatch(inp["x"], inp["ids"], inp["w"], inp["scale"], runtime_max_tokens_per_rank=runtime_tpr,
                    eplb_local_stats=eplb_local)
    # Copy now: the views expire when combine is issued.
    got = {"tokens_per_rank": r.tokens_per_rank}
    for name in ("hidden_states", "topk_ids", "topk_weights", "hidden_states_scale", "recv_counts",
                 "local_expert_counts", "eplb_gathered_stats"):
        v = getattr(r, name)
        got[name] = None if v is None else np.from_dlpack(v).copy()
    eo = case.expert_output(rank)
    if zero_copy:  # write the expert output into the library's view and combine from it
        r.combine_input.write(eo)
        np.testing.assert_array_equal(np.from_dlpack(r.combine_input), eo)
        eo = r.combine_input
    elif expert_output_3d:
        eo = eo.reshape(case.world, case.tpr, case.H)
    if out_buffer:
        out = np.full((inp["x"].shape[0], case.H), 7, dtype=case.combine_dtype)
        y = ep.combine(eo, out)
        got["combine_returned_buffer"] = y is out
        got["output"] = out.copy()
    else:
        got["output"] = np.from_dlpack(ep.combine(eo)).copy()
    return got


def compare(case, rank, got, eplb=False):
    exp = case.dispatch(rank)
    assert got["tokens_per_rank"] == case.tpr
    np.testing.assert_array_equal(got["recv_counts"], exp["recv_counts"])
    # Padding rows of hidden/scales are unspecified; ids and weights are not.
    for s in range(case.world):
        rows = slice(s * case.tpr, s * case.tpr + exp["recv_counts"][s])
        np.testing.assert_array_equal(got["hidden_states"][rows], exp["hidden_states"][rows],
                                      err_msg=f"hidden_states from source {s}")
        if case.scale_elems:
            np.testing.assert_array_equal(got["hidden_states_scale"][rows], exp["hidden_states_scale"][rows],
                                          err_msg=f"hidden_states_scale from source {s}")
    np.testing.assert_array_equal(got["topk_ids"], exp["topk_ids"])
    if case.inputs[rank]["w"] is not None:
        np.testing.assert_array_equal(got["topk_weights"], exp["topk_weights"])
    else:
        assert got["topk_weights"] is None
    if not case.scale_elems:
        assert got["hidden_states_scale"] is None
    np.testing.assert_array_equal(got["local_expert_counts"], exp["local_expert_counts"])
    if eplb:
        np.testing.assert_array_equal(got["eplb_gathered_stats"], exp["eplb_gathered_stats"])
    else:
        assert got["eplb_gathered_stats"] is None
    # Combine: bitwise equal to the rank-ordered fp32 sum, and close to the
    # layout-free closed form (which catches a wrong row being summed).
    y = got["output"]
    assert y.dtype == case.combine_dtype and y.shape == (case.inputs[rank]["x"].shape[0], case.H)
    np.testing.assert_array_equal(y, case.combine(rank))
    if case.inputs[rank]["w"] is not None:
        # fp16: each rank's partial sum was rounded to fp16 before the sum.
        rtol, atol = (5e-3, 5e-2) if case.combine_dtype == np.float16 else (1e-5, 1e-4)
        np.testing.assert_allclose(y.astype(np.float32), case.combine_closed_form(rank), rtol=rtol, atol=atol)
