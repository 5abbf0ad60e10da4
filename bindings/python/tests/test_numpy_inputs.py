"""What numpy users hand to dispatch and combine, on one rank (HOST backend):
bf16/fp16 payloads as same-width integer arrays or ml_dtypes arrays,
read-only inputs, and the messages that explain a wrong argument."""

import ctypes
import inspect
import pydoc

import numpy as np
import pytest

import moe_ep
from moe_ep import _lib


def bf16_bits(values):
    """float32 values that bf16 represents exactly -> their bf16 bit patterns."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32)
    assert not np.any(bits & 0xFFFF), "test values must be exact in bf16"
    return (bits >> 16).astype(np.uint16)


def view_bits(view, dtype):
    """A copy of a library view's bytes as `dtype` (numpy cannot import bf16)."""
    n = int(np.prod(view.shape))
    raw = (ctypes.c_char * (n * np.dtype(dtype).itemsize)).from_address(view.data_ptr)
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(view.shape)


def one_rank(**kw):
    args = dict(num_experts=2, top_k=1, max_tokens_per_rank=4, hidden_size=4, backend="host")
    args.update(kw)
    return moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **args)


# Three tokens: expert 1, no expert, expert 0.  Values exact in bf16 and fp16.
X = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [-0.5, 0.25, 96, -1024]], np.float32)
IDS = np.array([[1], [-1], [0]], np.int32)
SENT = [0, 2]  # the tokens that picked an expert, in receive order


def round_trip(ep, payload, expert_output_of):
    """dispatch(payload), combine(expert_output_of(received rows)) into a
    zeroed array like payload; returns (received, combined)."""
    r = ep.dispatch(payload, IDS)
    received = view_bits(r.hidden_states, np.uint16)  # every payload here is 16-bit
    out = np.zeros_like(payload)
    ep.combine(expert_output_of(received), out)
    return received, out


@pytest.mark.parametrize("int_type", [np.uint16, np.int16])
def test_bf16_payload_as_same_width_integers(int_type):
    """The default dtypes (bf16): a uint16/int16 array of bf16 bit patterns is
    dispatched and combined as bf16."""
    bits = bf16_bits(X).view(int_type)
    with one_rank() as ep:
        received, out = round_trip(ep, bits, lambda rows: rows.view(int_type).copy())
    np.testing.assert_array_equal(received[:2], bf16_bits(X[SENT]))
    expected = X.copy()
    expected[1] = 0  # picked no expert: nothing comes back
    np.testing.assert_array_equal(out.view(np.uint16), bf16_bits(expected))


def test_fp16_payload_as_uint16():
    bits = X.astype(np.float16).view(np.uint16)
    with one_rank(hidden_dtype="float16", combine_dtype="float16") as ep:
        _, out = round_trip(ep, bits, lambda rows: rows.copy())
    expected = X.copy()
    expected[1] = 0
    np.testing.assert_array_equal(out.view(np.float16), expected.astype(np.float16))


def test_integer_payload_of_another_width_is_refused():
    """Only the same width is a faithful carrier; fp32 payloads take fp32."""
    with one_rank() as ep:
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.dispatch(np.zeros((3, 4), np.uint8), IDS)
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "hidden_states" in e.value.message
    with one_rank(hidden_dtype="float32", combine_dtype="float32") as ep:
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.dispatch(np.zeros((3, 4), np.uint32), IDS)
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "hidden_states" in e.value.message


def test_ml_dtypes_bfloat16_arrays():
    ml_dtypes = pytest.importorskip(
        "ml_dtypes", reason="ml_dtypes is not installed (pip install ml_dtypes, or moe_ep[numpy])")
    x = X.astype(ml_dtypes.bfloat16)
    with one_rank() as ep:
        received, out = round_trip(ep, x, lambda rows: rows.view(ml_dtypes.bfloat16).copy())
    np.testing.assert_array_equal(received[:2], bf16_bits(X[SENT]))
    expected = X.copy()
    expected[1] = 0
    np.testing.assert_array_equal(out.astype(np.float32), expected)


class OldNumpyArray(np.ndarray):
    """Behaves like numpy < 2.1: no DLPack versioning, and a read-only array
    cannot be exported at all."""

    def __dlpack__(self, *args, **kwargs):
        if "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        if not self.flags.writeable:
            raise BufferError("Cannot export readonly array since signalling readonly is "
                              "unsupported by DLPack.")
        return np.asarray(self).__dlpack__(*args, **kwargs)


def read_only(a, cls=np.ndarray):
    a = np.array(a).view(cls)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("cls", [np.ndarray, OldNumpyArray], ids=["this_numpy", "numpy_before_2_1"])
def test_read_only_inputs_are_accepted(cls):
    """Inputs are only read: read-only arrays (np.from_dlpack views on numpy <
    2.1 are read-only) dispatch and combine like writable ones."""
    w = np.full((3, 1), 0.5, np.float32)
    with one_rank(hidden_dtype="float32", combine_dtype="float32") as ep:
        r = ep.dispatch(read_only(X, cls), read_only(IDS, cls), read_only(w, cls))
        rows = np.from_dlpack(r.hidden_states)
        np.testing.assert_array_equal(rows[:2], X[SENT])
        np.testing.assert_array_equal(np.from_dlpack(r.topk_weights)[:2], w[SENT])
        y = np.from_dlpack(ep.combine(read_only(rows * 2, cls)))
        expected = 2 * X
        expected[1] = 0
        np.testing.assert_array_equal(y, expected)  # before destroy frees y's memory
        del rows, y


def test_read_only_output_is_still_refused():
    with one_rank(hidden_dtype="float32", combine_dtype="float32") as ep:
        r = ep.dispatch(X, IDS)
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.combine(r.hidden_states, read_only(np.zeros((3, 4), np.float32), OldNumpyArray))
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "read-only" in e.value.message


def test_bad_backend_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        one_rank(backend="nvlnk")
    for name in ("'auto'", "'host'", "'nvlink'"):
        assert name in str(e.value)
    assert "'nvlnk'" in str(e.value)


def test_help_shows_required_parameters_and_shapes():
    sig = inspect.signature(moe_ep.MoeEp)
    required = [n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty]
    assert required == ["bootstrap", "num_experts", "top_k", "max_tokens_per_rank", "hidden_size"]
    assert {"hidden_dtype", "combine_dtype", "backend", "timeout_ms"} <= set(sig.parameters)
    text = pydoc.render_doc(moe_ep.MoeEp, renderer=pydoc.plaintext)
    assert "max_tokens_per_rank" in text and "Required" in text
    assert "[T, K] int32" in moe_ep.MoeEp.dispatch.__doc__
    assert "[P, H]" in moe_ep.MoeEp.combine.__doc__ and "[T, H]" in moe_ep.MoeEp.combine.__doc__


def test_mpi_bootstrap_reports_the_adapter_message():
    """The adapter's own words (through moe_ep_last_error), not a guess."""
    try:
        _lib.mpi_lib()
    except OSError as e:
        pytest.skip(f"libmoe_ep_mpi not loadable here: {e}")

    class CommBeforeInit:  # what MpiBootstrap reads from an mpi4py communicator
        def py2f(self):
            return 0

    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.MpiBootstrap(CommBeforeInit())
    assert e.value.status == moe_ep.ERROR_INVALID_STATE
    assert "MPI: expected an initialised MPI, got MPI_Init not called yet" in e.value.message
