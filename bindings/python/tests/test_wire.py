"""The FP8 wire through the Python bindings, HOST backend: MoeEp(dispatch_wire=,
combine_wire=, wire_scale=, dispatch_dequantize=).  Codes and scales are
compared bit for bit with a small quantizer written here from
docs/semantics.md ("A low-precision wire"): a table of every finite e4m3fn
value searched for the nearest one, not the library's bit manipulation."""

import math

import numpy as np
import pytest

import moe_ep
from conftest import host_kwargs
from reference import Case, ExpertLayout, align_up

BLOCK = 128
E4M3_MAX = 448.0
NAN_CODE = 0x7F


def _e4m3_table():
    """Value of every non-negative finite code 0x00..0x7E, ascending."""
    vals = []
    for c in range(0x7F):
        e, m = c >> 3, c & 7
        vals.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(vals, np.float64)


E4M3 = _e4m3_table()
assert E4M3[0x7E] == E4M3_MAX and E4M3[0x38] == 1.0


def encode(q):
    """One fp32 value -> its e4m3fn code: nearest finite value, ties to the
    even code, saturated at 448, NaN -> 0x7F, the sign kept (also on zero)."""
    q = float(q)
    if math.isnan(q):
        return NAN_CODE
    sign = 0x80 if math.copysign(1.0, q) < 0 else 0
    a = abs(q)
    if a >= E4M3_MAX:
        return sign | 0x7E
    i = int(np.searchsorted(E4M3, a, side="right")) - 1  # E4M3[i] <= a < E4M3[i + 1]
    lo, hi = a - E4M3[i], E4M3[i + 1] - a
    code = i if lo < hi else i + 1 if hi < lo else (i if i % 2 == 0 else i + 1)
    return sign | code


def decode(code):
    if code & 0x7F == NAN_CODE:
        return np.float32(np.nan)
    v = np.float32(E4M3[code & 0x7F])
    return -v if code & 0x80 else v


def block_scale(block, rule):
    """The scale of one block of fp32 values (docs/semantics.md)."""
    finite = np.abs(block[np.isfinite(block)])
    amax = float(finite.max()) if finite.size else 0.0
    if amax == 0.0:
        return np.float32(1.0)
    if rule == "fp32":
        s = np.float32(amax) / np.float32(E4M3_MAX)  # one fp32 division, round to nearest even
        return s if s != 0 else np.float32(2.0 ** -149)
    e = -127
    while E4M3_MAX * 2.0 ** e < amax:  # exact in float64
        e += 1
    return np.float32(2.0 ** e)


def quantize_row(row, rule):
    """fp32 row -> (uint8 codes [n], fp32 scales [ceil(n / 128)])."""
    row = np.asarray(row, np.float32)
    n = row.shape[0]
    codes = np.zeros(n, np.uint8)
    scales = np.zeros(-(-n // BLOCK), np.float32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for b in range(scales.shape[0]):
            blk = row[b * BLOCK:(b + 1) * BLOCK]
            s = block_scale(blk, rule)
            scales[b] = s
            codes[b * BLOCK:b * BLOCK + blk.shape[0]] = [encode(np.float32(v) / s) for v in blk]
    return codes, scales


def dequantize_row(codes, scales):
    out = np.array([decode(int(c)) for c in codes], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        return out * np.repeat(scales, BLOCK)[:out.shape[0]]  # one fp32 product per element


def bf16_bits(x):
    """fp32 -> bf16 bits (round to nearest even), as uint16."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fp8_kwargs(**extra):
    kw = dict(backend="host", timeout_ms=60000, hidden_dtype="float32", combine_dtype="float32",
              dispatch_wire="fp8_e4m3_block128")
    kw.update(extra)
    return kw


def single_dispatch(x, rule="fp32", **extra):
    """Dispatch `x` [T, R] on one rank with every token to expert 0; returns
    copies of (hidden_states raw bits, hidden_states view dtype, scales)."""
    T, R = x.shape
    ids = np.zeros((T, 1), np.int32)
    with moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), num_experts=1, top_k=1, max_tokens_per_rank=T,
                      hidden_size=R, **fp8_kwargs(wire_scale=rule, **extra)) as ep:
        r = ep.dispatch(x, ids)
        assert r.hidden_states.shape == (T, R)
        codes = np.from_dlpack(r.hidden_states.view_as("uint8")).copy()
        scales = np.from_dlpack(r.hidden_states_scale).copy()
        return codes, r.hidden_states.dtype, scales


def test_known_values():
    R = BLOCK + 2  # the second block holds 2 elements
    x = np.zeros((3, R), np.float32)
    x[0, :6] = [1.0, 448.0, 0.0, -0.0, 0.5, -448.0]
    x[0, 6:11] = [1.0625, 1.1875, 2.0 ** -10, 3 * 2.0 ** -10, 432.0]  # ties go to the even code
    x[0, BLOCK:] = [3.0, -1.5]
    # row 1: all zeros
    x[2, :5] = [np.nan, np.inf, -np.inf, 2.0, 1e-3]
    codes, dtype, scales = single_dispatch(x)
    assert dtype == "float8_e4m3fn"
    assert scales.dtype == np.float32 and scales.shape == (3, 2)
    # Block 0 of row 0: amax 448 gives scale 1.0, and the values are their own codes.
    assert scales[0, 0] == 1.0
    assert list(codes[0, :11]) == [0x38, 0x7E, 0x00, 0x80, 0x30, 0xFE, 0x38, 0x3A, 0x00, 0x02, 0x7E]
    assert not codes[0, 11:BLOCK].any()
    assert scales[0, 1] == np.float32(3.0) / np.float32(448.0)
    assert list(codes[0, BLOCK:]) == [0x7E, encode(np.float32(-1.5) / scales[0, 1])]
    # A block of zeros: scale 1.0, codes 0.
    assert list(scales[1]) == [1.0, 1.0] and not codes[1].any()
    # NaN and Inf are left out of amax (2.0): NaN -> 0x7F, +-Inf saturate.
    assert scales[2, 0] == np.float32(2.0) / np.float32(448.0)
    assert list(codes[2, :4]) == [0x7F, 0x7E, 0xFE, 0x7E]
    assert codes[2, 4] == encode(np.float32(1e-3) / scales[2, 0])
    for t in range(3):
        want_codes, want_scales = quantize_row(x[t], "fp32")
        np.testing.assert_array_equal(codes[t], want_codes)
        np.testing.assert_array_equal(scales[t].view(np.uint32), want_scales.view(np.uint32))


def test_ue8m0_scales_are_powers_of_two():
    x = np.zeros((5, BLOCK), np.float32)
    x[0, 0], x[1, 0], x[2, 0], x[3, 0] = 448.0, 449.0, 1.0, 3e-38
    codes, _, scales = single_dispatch(x, rule="ue8m0")
    assert scales[:, 0].tolist() == [1.0, 2.0, 2.0 ** -8, np.float32(2.0 ** -127), 1.0]
    assert codes[0, 0] == 0x7E and codes[2, 0] == encode(np.float32(1.0) / np.float32(2.0 ** -8))
    for t in range(5):
        want_codes, want_scales = quantize_row(x[t], "ue8m0")
        np.testing.assert_array_equal(codes[t], want_codes)
        np.testing.assert_array_equal(scales[t], want_scales)


def _rows(rng, T, R):
    """Random rows with blocks of very different magnitudes, zeros, a NaN and
    an Inf, so that subnormal codes, tiny and huge scales all occur."""
    x = rng.standard_normal((T, R)).astype(np.float32)
    mags = np.float32(10.0) ** rng.integers(-40, 38, (T, 1)).astype(np.float32)
    with np.errstate(over="ignore", under="ignore"):
        x = (x * mags).astype(np.float32)
    if T:
        x[0, :BLOCK] = 0
        x[-1, 3] = np.nan
        x[T // 2, R - 1] = np.inf
    return x


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("rule", ["fp32", "ue8m0"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dispatch_matches_model(thread_group, world, rule, dtype):
    E, K, R, tpr = 2 * world, 2, 2 * BLOCK + 72, 6
    case = Case(seed=100 + world, world=world, num_experts=E, top_k=K, hidden=R, tokens_per_rank=tpr)
    rng = np.random.default_rng(7 + world)
    for inp in case.inputs:  # fp32 payloads, or bf16 bits whose values the model reads back
        x = _rows(rng, inp["x"].shape[0], R)
        inp["x"] = bf16_to_f32(bf16_bits(x)) if dtype == "bfloat16" else x
        inp["send"] = bf16_bits(x) if dtype == "bfloat16" else x

    def rank_main(rank, bs):
        inp = case.inputs[rank]
        with moe_ep.MoeEp(bs, **host_kwargs(case, hidden_dtype=dtype, dispatch_wire="fp8_e4m3_block128",
                                            wire_scale=rule)) as ep:
            r = ep.dispatch(inp["send"], inp["ids"], inp["w"])
            assert r.hidden_states.dtype == "float8_e4m3fn"
            assert r.hidden_states.shape == (world * tpr, R)
            assert r.hidden_states_scale.shape == (world * tpr, 3)
            codes = np.from_dlpack(r.hidden_states.view_as("uint8"))
            scales = np.from_dlpack(r.hidden_states_scale)
            want = case.dispatch(rank)
            counts = np.from_dlpack(r.recv_counts)
            np.testing.assert_array_equal(counts, want["recv_counts"])
            np.testing.assert_array_equal(np.from_dlpack(r.topk_ids), want["topk_ids"])
            for s in range(world):
                for j in range(counts[s]):
                    row = s * tpr + j
                    wc, ws = quantize_row(want["hidden_states"][row], rule)
                    np.testing.assert_array_equal(codes[row], wc, err_msg=f"codes of row {row}")
                    np.testing.assert_array_equal(scales[row].view(np.uint32), ws.view(np.uint32),
                                                  err_msg=f"scales of row {row}")
        return True

    assert all(thread_group(world).run(rank_main))


@pytest.mark.parametrize("rule", ["fp32", "ue8m0"])
def test_dispatch_dequantize(thread_group, rule):
    world, R, tpr = 2, BLOCK + 5, 4
    case = Case(seed=31, world=world, num_experts=4, top_k=2, hidden=R, tokens_per_rank=tpr)

    def rank_main(rank, bs):
        inp = case.inputs[rank]
        with moe_ep.MoeEp(bs, **host_kwargs(case, dispatch_wire="fp8_e4m3_block128", wire_scale=rule,
                                            dispatch_dequantize=True)) as ep:
            r = ep.dispatch(inp["x"], inp["ids"], inp["w"])
            assert r.hidden_states.dtype == "float32" and r.hidden_states.shape == (world * tpr, R)
            assert r.hidden_states_scale is None
            rows = np.from_dlpack(r.hidden_states)
            want = case.dispatch(rank)
            for s in range(world):
                for j in range(want["recv_counts"][s]):
                    row = s * tpr + j
                    expect = dequantize_row(*quantize_row(want["hidden_states"][row], rule))
                    np.testing.assert_array_equal(rows[row].view(np.uint32), expect.view(np.uint32))
                    # The documented bound: half a 3-bit-mantissa step, or half a subnormal step.
                    x = want["hidden_states"][row]
                    s_blk = np.repeat(quantize_row(x, rule)[1], BLOCK)[:R]
                    assert (np.abs(rows[row] - x) <= 2.0 ** -4 * np.abs(x) + 2.0 ** -10 * s_blk).all()
        return True

    assert all(thread_group(world).run(rank_main))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("rule", ["fp32", "ue8m0"])
def test_combine_fp8_wire(thread_group, world, rule):
    """Bitwise the model (each rank's rows quantized, dequantized to fp32,
    summed in ascending rank order), and within the documented bound of the
    same combine with AS_IS."""
    H, tpr = BLOCK + 40, 5
    case = Case(seed=55 + world, world=world, num_experts=2 * world, top_k=2, hidden=H, tokens_per_rank=tpr)

    def expected(me):
        ids = case.inputs[me]["ids"]
        acc = np.zeros((ids.shape[0], H), np.float32)
        bound = np.zeros_like(acc)
        for r in range(world):
            eo = case.expert_output(r)
            mask = case.goes_to(ids, r)
            slots = np.cumsum(mask) - 1
            for t in np.nonzero(mask)[0]:
                v = eo[me * tpr + slots[t]]
                codes, scales = quantize_row(v, rule)
                acc[t] = acc[t] + dequantize_row(codes, scales)
                bound[t] += 2.0 ** -4 * np.abs(v) + 2.0 ** -10 * np.repeat(scales, BLOCK)[:H] \
                    + 2.0 ** -20 * np.abs(v)  # the fp32 sums' own rounding
        return acc, bound

    def rank_main(rank, bs):
        eo = case.expert_output(rank)
        got = {}
        for wire in ("as_is", "fp8_e4m3_block128"):
            with moe_ep.MoeEp(bs, **host_kwargs(case, combine_wire=wire, wire_scale=rule if wire != "as_is" else None)) as ep:
                inp = case.inputs[rank]
                ep.dispatch(inp["x"], inp["ids"], inp["w"])
                got[wire] = np.from_dlpack(ep.combine(eo)).copy()
        want, bound = expected(rank)
        np.testing.assert_array_equal(got["fp8_e4m3_block128"].view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(got["as_is"], case.combine(rank))
        err = np.abs(got["fp8_e4m3_block128"] - got["as_is"])
        assert (err <= bound).all(), f"max excess {np.max(err - bound)}"
        return True

    assert all(thread_group(world).run(rank_main))


def test_expert_packed_column_major_scales(thread_group):
    world, R, tpr, align = 2, 2 * BLOCK + 1, 4, 4
    case = Case(seed=77, world=world, num_experts=4, top_k=2, hidden=R, tokens_per_rank=tpr)

    def rank_main(rank, bs):
        lay = ExpertLayout(case, rank, "expert_packed", alignment=align)
        inp = case.inputs[rank]
        with moe_ep.MoeEp(bs, **host_kwargs(case, dispatch_wire="fp8_e4m3_block128", receive_layout="expert_packed",
                                            expert_alignment=align, scale_layout="column_major")) as ep:
            r = ep.dispatch(inp["x"], inp["ids"], inp["w"])
            assert r.hidden_states.dtype == "float8_e4m3fn" and r.hidden_states.shape == (lay.rows, R)
            assert r.hidden_states_scale.shape == (3, align_up(lay.rows, 4))
            codes = np.from_dlpack(r.hidden_states.view_as("uint8"))
            scales = np.from_dlpack(r.hidden_states_scale)
            for (s, t, _), row in lay.row_of.items():
                wc, ws = quantize_row(case.inputs[s]["x"][t], "fp32")
                np.testing.assert_array_equal(codes[row], wc)
                np.testing.assert_array_equal(scales[:, row], ws)
        return True

    assert all(thread_group(world).run(rank_main))


def test_fp8_view_as_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    x = np.array([[1.0, -2.0, 0.5, 448.0]], np.float32)
    with moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), num_experts=1, top_k=1, max_tokens_per_rank=1,
                      hidden_size=4, **fp8_kwargs()) as ep:
        r = ep.dispatch(x, np.zeros((1, 1), np.int32))
        a = r.hidden_states.numpy()
        assert a.dtype == ml_dtypes.float8_e4m3fn
        np.testing.assert_array_equal(a.astype(np.float32), x)  # amax 448: scale 1.0


@pytest.mark.parametrize("arg,value,accepted", [
    ("dispatch_wire", "fp9", "'as_is', 'fp8_e4m3_block128'"),
    ("combine_wire", "bf16", "'as_is', 'fp8_e4m3_block128'"),
    ("wire_scale", "e8m0", "'fp32', 'ue8m0'"),
])
def test_bad_names_refused(arg, value, accepted):
    with pytest.raises(ValueError) as e:
        moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), num_experts=1, top_k=1, max_tokens_per_rank=1, hidden_size=4,
                     backend="host", **{arg: value})
    assert f"unknown {arg} {value!r}" in str(e.value) and accepted in str(e.value)
    with pytest.raises(ValueError, match=arg):
        moe_ep.workspace_size(1, num_experts=1, top_k=1, max_tokens_per_rank=1, hidden_size=4, **{arg: 1.5})


@pytest.mark.parametrize("kw,field", [
    (dict(dispatch_wire=7), "dispatch_wire"),
    (dict(combine_wire=-1), "combine_wire"),
    (dict(dispatch_wire="fp8_e4m3_block128", wire_scale=5), "wire_scale"),
    (dict(wire_scale="ue8m0"), "wire_scale"),  # no FP8 wire uses it
    (dict(dispatch_dequantize=True), "dispatch_dequantize"),  # no FP8 dispatch wire
    (dict(dispatch_wire="fp8_e4m3_block128", scale_row_elems=1), "scale_row_elems"),
    (dict(dispatch_wire="fp8_e4m3_block128", hidden_dtype="float8_e4m3fn"), "hidden_dtype"),
])
def test_bad_values_refused_by_the_library(kw, field):
    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), num_experts=1, top_k=1, max_tokens_per_rank=1, hidden_size=4,
                     backend="host", **kw)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT
    assert f"params->{field}" in e.value.message


def test_constants_and_workspace():
    assert (moe_ep.WIRE_AS_IS, moe_ep.WIRE_FP8_E4M3_BLOCK128) == (0, 1)
    assert (moe_ep.WIRE_SCALE_FP32, moe_ep.WIRE_SCALE_UE8M0) == (0, 1)
    kw = dict(num_experts=2, top_k=1, max_tokens_per_rank=16, hidden_size=1024, backend="host")
    # Names and ints are the same parameter.
    assert moe_ep.workspace_size(2, dispatch_wire="fp8_e4m3_block128", **kw) == \
        moe_ep.workspace_size(2, dispatch_wire=moe_ep.WIRE_FP8_E4M3_BLOCK128, **kw)


def test_split_phases_and_zero_copy_input(thread_group):
    """Both FP8 wires with micro_batches=2 and zero_copy_combine: the split
    halves give the fused calls' bits, and a combine of combine_input (written
    in place) the bits of a combine of the same rows passed as an array."""
    world, H, tpr = 2, BLOCK + 9, 3
    case = Case(seed=91, world=world, num_experts=4, top_k=2, hidden=H, tokens_per_rank=tpr)

    def rank_main(rank, bs):
        inp = case.inputs[rank]
        eo = case.expert_output(rank)
        with moe_ep.MoeEp(bs, **host_kwargs(case, dispatch_wire="fp8_e4m3_block128",
                                            combine_wire="fp8_e4m3_block128", wire_scale="ue8m0",
                                            micro_batches=2, zero_copy_combine=True)) as ep:
            r = ep.dispatch(inp["x"], inp["ids"], inp["w"])
            fused = (np.from_dlpack(r.hidden_states.view_as("uint8")).copy(),
                     np.from_dlpack(r.hidden_states_scale).copy())
            y_fused = np.from_dlpack(ep.combine(eo)).copy()
            ep.dispatch_send(inp["x"], inp["ids"], inp["w"], slot=1)
            r = ep.dispatch_recv(slot=1)
            assert r.hidden_states.dtype == "float8_e4m3fn"
            split = (np.from_dlpack(r.hidden_states.view_as("uint8")), np.from_dlpack(r.hidden_states_scale))
            counts = np.from_dlpack(r.recv_counts)
            for s in range(world):  # rows past the counts are padding, unspecified
                rows = slice(s * tpr, s * tpr + counts[s])
                np.testing.assert_array_equal(split[0][rows], fused[0][rows])
                np.testing.assert_array_equal(split[1][rows], fused[1][rows])
            r.combine_input.write(eo)
            ep.combine_send(r.combine_input, slot=1)
            y_split = np.from_dlpack(ep.combine_recv(slot=1))
            np.testing.assert_array_equal(y_split.view(np.uint32), y_fused.view(np.uint32))
        return True

    assert all(thread_group(world).run(rank_main))
