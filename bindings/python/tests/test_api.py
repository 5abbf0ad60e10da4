"""Single-process tests of the Python API on the HOST backend: loading,
versions, errors, the handle's lifecycle, and DLPack in both directions."""

import ctypes
import gc
import os
import re
import warnings

import numpy as np
import pytest

import moe_ep
from moe_ep import _dlpack, _lib

import checks
import reference
from conftest import host_kwargs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def small_ep(**extra):
    kw = dict(num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3, hidden_dtype="float32",
              combine_dtype="float32", backend="host")
    kw.update(extra)
    return moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **kw)


def inputs(T=5):
    x = np.arange(T * 3, dtype=np.float32).reshape(T, 3)
    ids = np.array([[0, 1], [2, -1], [3, 3], [-1, -1], [1, 2], [0, 0], [1, 1], [2, 2]][:T], dtype=np.int32)
    w = np.full((T, 2), 0.5, np.float32)
    return x, ids, w


def test_version_matches_header():
    header = open(os.path.join(REPO, "include", "moe_ep_c.h")).read()
    expected = tuple(int(re.search(rf"#define MOE_EP_VERSION_{p} (\d+)", header).group(1))
                     for p in ("MAJOR", "MINOR", "PATCH"))
    assert moe_ep.get_version() == expected


def test_status_strings():
    assert moe_ep.status_string(moe_ep.SUCCESS) == "MOE_EP_SUCCESS"
    assert moe_ep.status_string(moe_ep.ERROR_TIMEOUT) == "MOE_EP_ERROR_TIMEOUT"
    assert moe_ep.status_string(moe_ep.ERROR_INVALID_INPUT) == "MOE_EP_ERROR_INVALID_INPUT"


def test_layout_matches_c_probe():
    """Every ctypes Structure has the C compiler's size and field offsets."""
    probe = os.environ.get("MOE_EP_LAYOUT_PROBE_OUTPUT")
    if not probe:
        pytest.skip("MOE_EP_LAYOUT_PROBE_OUTPUT not set (the CTest registration sets it)")
    structs = {"moe_ep_device_t": _lib.Device, "moe_ep_dtype_t": _lib.DType, "moe_ep_tensor_t": _lib.Tensor,
               "moe_ep_bootstrap_t": _lib.BootstrapStruct, "moe_ep_params_t": _lib.Params,
               "moe_ep_config_t": _lib.Config, "moe_ep_dispatch_args_t": _lib.DispatchArgs,
               "moe_ep_dispatch_result_t": _lib.DispatchResult, "moe_ep_combine_result_t": _lib.CombineResult,
               "moe_ep_health_t": _lib.Health}
    seen = set()
    for line in open(probe).read().split("\n"):
        if not line.strip():
            continue
        name, field, a, b = line.split()
        cls = structs[name]
        seen.add(name)
        if field == "sizeof":
            assert ctypes.sizeof(cls) == int(a), name
            assert ctypes.alignment(cls) == int(b), name
        else:
            desc = getattr(cls, field)
            assert (desc.offset, desc.size) == (int(a), int(b)), f"{name}.{field}"
    assert seen == set(structs)


def test_platform_support_and_workspace():
    assert moe_ep.is_platform_supported(0) in (True, False)
    small = moe_ep.workspace_size(2, num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=16,
                                  backend="host")
    big = moe_ep.workspace_size(2, num_experts=4, top_k=2, max_tokens_per_rank=64, hidden_size=16,
                                backend="host")
    assert 0 < small < big
    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.workspace_size(3, num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=16)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "num_experts" in e.value.message


def test_dispatch_combine_single_rank_by_hand():
    x, ids, w = inputs()
    with small_ep() as ep:
        assert ep.backend == "host"
        r = ep.dispatch(x, ids, w)
        assert r.tokens_per_rank == 8
        assert r.hidden_states.shape == (8, 3) and r.hidden_states.dtype == "float32"
        assert r.hidden_states.device == (moe_ep.DEVICE_CPU, 0)
        # Token 3 has no valid pick: it is not sent; the others arrive in order.
        np.testing.assert_array_equal(np.from_dlpack(r.recv_counts), [4])
        np.testing.assert_array_equal(np.from_dlpack(r.hidden_states)[:4], x[[0, 1, 2, 4]])
        np.testing.assert_array_equal(np.from_dlpack(r.topk_ids)[:4], ids[[0, 1, 2, 4]])
        np.testing.assert_array_equal(np.from_dlpack(r.topk_ids)[4:], -1)
        np.testing.assert_array_equal(np.from_dlpack(r.topk_weights)[4:], 0)
        np.testing.assert_array_equal(np.from_dlpack(r.local_expert_counts), [1, 2, 2, 2])
        assert r.hidden_states_scale is None and r.eplb_gathered_stats is None
        # Identity experts: combine returns each sent token once, zeros for token 3.
        y = np.from_dlpack(ep.combine(r.hidden_states))
        np.testing.assert_array_equal(y, np.where(np.arange(5)[:, None] == 3, 0, x))


def test_zero_copy_combine_input_single_rank():
    x, ids, w = inputs()
    with small_ep(zero_copy_combine=True) as ep:
        r = ep.dispatch(x, ids, w)
        assert r.combine_input.shape == (8, 3) and r.combine_input.dtype == "float32"
        with pytest.raises(moe_ep.MoeEpError) as e:
            r.combine_input.write(np.zeros((8, 2), np.float32))
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT
        rows = np.from_dlpack(r.hidden_states).copy()
        r.combine_input.write(rows)  # identity experts, written in place
        view = r.combine_input
        y = np.from_dlpack(ep.combine(view)).copy()
        np.testing.assert_array_equal(y, np.where(np.arange(5)[:, None] == 3, 0, x))
        # Issued: the view has expired for the binding too.
        assert not view.valid
        with pytest.raises(moe_ep.MoeEpError):
            view.write(rows)
    with small_ep() as plain:
        assert plain.dispatch(x, ids, w).combine_input is None


@pytest.mark.parametrize("combine_dtype", [np.float32, np.float16])
def test_random_case_single_rank(combine_dtype):
    case = reference.Case(seed=11, world=1, num_experts=6, top_k=3, hidden=5, tokens_per_rank=9,
                          scale_elems=2, combine_dtype=combine_dtype)
    with moe_ep.MoeEp(moe_ep.SingleRankBootstrap(), **host_kwargs(case, enable_eplb_stats=True)) as ep:
        got = checks.run_rank(ep, case, 0, out_buffer=True)
    assert got["combine_returned_buffer"]
    checks.compare(case, 0, got, eplb=True)


def test_errors_name_the_argument_and_keep_the_handle_usable():
    x, ids, w = inputs()
    with small_ep() as ep:
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.dispatch(x, ids.astype(np.int64), w)
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT
        assert "topk_ids" in e.value.message and "int32" in e.value.message and "int64" in e.value.message
        assert str(e.value).startswith("MOE_EP_ERROR_INVALID_ARGUMENT: ")
        with pytest.raises(moe_ep.MoeEpError) as e:  # T = 5 > runtime tokens_per_rank = 4
            ep.dispatch(x, ids, w, runtime_max_tokens_per_rank=4)
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "local_num_tokens" in e.value.message
        with pytest.raises(moe_ep.MoeEpError) as e:  # not compact
            ep.dispatch(np.asfortranarray(np.ones((5, 3), np.float32)), ids, w)
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "strides" in e.value.message
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.combine(np.zeros((8, 3), np.float32))
        assert e.value.status == moe_ep.ERROR_INVALID_STATE
        with pytest.raises(TypeError):
            ep.dispatch([[1.0, 2.0, 3.0]], ids[:1], w[:1])
        # Still usable after all of that.
        r = ep.dispatch(x, ids, w)
        np.testing.assert_array_equal(np.from_dlpack(r.recv_counts), [4])
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.dispatch(x, ids, w)
        assert e.value.status == moe_ep.ERROR_INVALID_STATE
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.combine(np.zeros((8, 4), np.float32))  # wrong hidden size
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "expert_output" in e.value.message
        ep.combine(np.zeros((8, 3), np.float32))


def test_create_errors():
    with pytest.raises(moe_ep.MoeEpError) as e:
        small_ep(top_k=5)
    assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "top_k" in e.value.message
    with pytest.raises(ValueError):
        small_ep(hidden_dtype="complex64")


def test_bad_expert_ids_are_an_async_error():
    x, ids, w = inputs()
    ids = ids.copy()
    ids[2, 0] = 99
    with small_ep() as ep:
        r = ep.dispatch(x, ids, w)
        assert np.from_dlpack(r.recv_counts)[0] == 4  # token 2 still goes (its pick 3 is valid)
        ep.combine(r.hidden_states)
        err = ep.async_error()
        assert isinstance(err, moe_ep.MoeEpError) and err.status == moe_ep.ERROR_INVALID_INPUT
        assert "99" in err.message
        assert ep.async_error() is None  # INVALID_INPUT is cleared once read
        ep.check_async_error()


def test_context_manager_destroys_and_views_expire():
    x, ids, w = inputs()
    with small_ep() as ep:
        r = ep.dispatch(x, ids, w)
        assert r.hidden_states.valid
        out = ep.combine(np.zeros((8, 3), np.float32))
        # The dispatch views expired when combine was issued.
        assert not r.hidden_states.valid
        with pytest.raises(moe_ep.MoeEpError) as e:
            np.from_dlpack(r.hidden_states)
        assert e.value.status == moe_ep.ERROR_INVALID_STATE and "combine" in e.value.message
        assert out.valid
    assert ep.closed and not out.valid
    with pytest.raises(moe_ep.MoeEpError) as e:
        ep.dispatch(x, ids, w)
    assert e.value.status == moe_ep.ERROR_INVALID_STATE
    ep.destroy()  # idempotent


def test_library_owned_combine_output_expires_at_next_combine():
    x, ids, w = inputs()
    with small_ep() as ep:
        ep.dispatch(x, ids, w)
        first = ep.combine(np.zeros((8, 3), np.float32))
        ep.dispatch(x, ids, w)
        assert first.valid
        ep.combine(np.zeros((8, 3), np.float32))
        assert not first.valid


def test_exported_arrays_alias_library_memory_and_keep_the_handle_alive():
    x, ids, w = inputs()
    base = _dlpack.live_exports()
    ep = small_ep()
    r = ep.dispatch(x, ids, w)
    a = np.from_dlpack(r.hidden_states)
    b = np.from_dlpack(r.hidden_states)
    # No copy: both arrays are the library's buffer (numpy 1.x marks DLPack
    # imports read-only, so write through ctypes to show the aliasing).
    assert a.__array_interface__["data"][0] == r.hidden_states.data_ptr
    ctypes.memmove(r.hidden_states.data_ptr, ctypes.byref(ctypes.c_float(42.0)), 4)
    assert a[0, 0] == 42.0 and b[0, 0] == 42.0
    assert _dlpack.live_exports() == base + 2
    del r
    gc.collect()
    assert not ep.closed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ep.combine(np.zeros((8, 3), np.float32))
        ep.destroy()
    assert any(issubclass(c.category, ResourceWarning) for c in caught)
    del a, b
    gc.collect()
    assert _dlpack.live_exports() == base


def test_unconsumed_capsules_are_freed():
    x, ids, w = inputs()
    base = _dlpack.live_exports()
    with small_ep() as ep:
        r = ep.dispatch(x, ids, w)
        for kw in ({}, {"max_version": (1, 0)}):
            cap = r.topk_ids.__dlpack__(**kw)
            assert _dlpack.live_exports() == base + 1
            del cap
            assert _dlpack.live_exports() == base
        ep.combine(np.zeros((8, 3), np.float32))


def bf16_ep():
    return small_ep(hidden_dtype="bfloat16", combine_dtype="bfloat16")


def bf16_bits(values):
    return (np.asarray(values, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def test_numpy_refusing_a_bfloat16_view_keeps_its_error_and_leaks_nothing():
    """numpy has no bfloat16: np.from_dlpack must raise numpy's own error (not a
    SystemError), and the refused export must not stay registered as live."""
    x = bf16_bits(np.arange(15).reshape(5, 3) * 0.5)
    _, ids, _ = inputs()
    base = _dlpack.live_exports()
    ep = bf16_ep()
    r = ep.dispatch(x, ids)
    for _ in range(50):
        with pytest.raises(Exception) as caught:
            np.from_dlpack(r.hidden_states)
        assert not isinstance(caught.value, SystemError), repr(caught.value)
        assert "NULL" not in str(caught.value)
    assert _dlpack.live_exports() == base
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ep.combine(np.zeros((8, 3), np.uint16))
        ep.destroy()
    assert not [w for w in seen if issubclass(w.category, ResourceWarning)], [str(w.message) for w in seen]
    assert _dlpack.live_exports() == base


def test_bfloat16_rows_read_in_numpy_as_raw_bits_or_ml_dtypes():
    x = bf16_bits(np.arange(15).reshape(5, 3) * 0.5)
    _, ids, _ = inputs()
    base = _dlpack.live_exports()
    with bf16_ep() as ep:
        r = ep.dispatch(x, ids)
        bits = np.from_dlpack(r.hidden_states.view_as("uint16"))
        assert bits.dtype == np.uint16 and bits.shape == (8, 3)
        np.testing.assert_array_equal(bits[:4], x[[0, 1, 2, 4]])
        assert bits.__array_interface__["data"][0] == r.hidden_states.data_ptr  # no copy
        assert r.hidden_states.view_as("int16").dtype == "int16"
        with pytest.raises(moe_ep.MoeEpError, match="16 bits"):
            r.hidden_states.view_as("uint32")
        with pytest.raises(moe_ep.MoeEpError, match="not one of"):
            r.hidden_states.view_as("bf16")
        np.testing.assert_array_equal(r.topk_ids.numpy(), np.from_dlpack(r.topk_ids))  # numpy's own dtypes
        try:
            import ml_dtypes
        except ImportError:
            with pytest.raises(moe_ep.MoeEpError, match=r"numpy has no bfloat16.*view_as\('uint16'\)"):
                r.hidden_states.numpy()
        else:
            values = r.hidden_states.numpy()
            assert values.dtype == ml_dtypes.bfloat16
            np.testing.assert_array_equal(values[:4].astype(np.float32), (np.arange(15).reshape(5, 3) * 0.5)[[0, 1, 2, 4]])
        del bits
        ep.combine(np.zeros((8, 3), np.uint16))
        # view_as follows the validity of the view it came from.
        with pytest.raises(moe_ep.MoeEpError, match="no longer valid"):
            r.hidden_states.view_as("uint16")
    gc.collect()
    assert _dlpack.live_exports() == base


def test_a_capsule_held_but_not_consumed_stays_live_until_dropped():
    x, ids, w = inputs()
    with small_ep() as ep:
        r = ep.dispatch(x, ids, w)
        base = _dlpack.live_exports()
        held = [r.recv_counts.__dlpack__() for _ in range(3)]
        assert _dlpack.live_exports() == base + 3
        consumed = np.from_dlpack(r.recv_counts)  # a consumed one lives while its array does
        assert _dlpack.live_exports() == base + 4
        del held[:2]
        assert _dlpack.live_exports() == base + 2
        del held, consumed
        gc.collect()
        assert _dlpack.live_exports() == base
        ep.combine(np.zeros((8, 3), np.float32))


def test_versioned_capsules_in_and_out():
    """A versioned export round-trips through the library's borrow path, and a
    read-only versioned tensor is refused as combine output."""
    x, ids, w = inputs()

    class Producer:  # hands out a capsule of our choice, like a DLPack 1.x library
        def __init__(self, arr, readonly=False):
            self.arr, self.readonly = arr, readonly

        def __dlpack_device__(self):
            return (moe_ep.DEVICE_CPU, 0)

        def __dlpack__(self, max_version=None, stream=None):
            assert max_version is not None and max_version[0] == 1
            cap = _dlpack.export(self.arr, self.arr.ctypes.data, (1, 0), moe_ep.dtype_tuple(self.arr.dtype),
                                 self.arr.shape, versioned=True)
            if self.readonly:
                m = _lib.DLManagedTensorVersioned.from_address(_dlpack._GetPointer(cap, b"dltensor_versioned"))
                m.flags |= _lib.DLPACK_FLAG_READ_ONLY
            return cap

    with small_ep() as ep:
        r = ep.dispatch(Producer(x), Producer(ids), Producer(w))
        np.testing.assert_array_equal(np.from_dlpack(r.hidden_states)[:4], x[[0, 1, 2, 4]])
        out = np.zeros((5, 3), np.float32)
        with pytest.raises(moe_ep.MoeEpError) as e:
            ep.combine(r.hidden_states, Producer(out, readonly=True))
        assert e.value.status == moe_ep.ERROR_INVALID_ARGUMENT and "read-only" in e.value.message
        y = ep.combine(r.hidden_states, Producer(out))
        assert isinstance(y, Producer)
        np.testing.assert_array_equal(out[[0, 1, 2, 4]], x[[0, 1, 2, 4]])


def test_empty_rank():
    """T = 0: empty inputs dispatch nothing and combine to an empty view."""
    with small_ep() as ep:
        r = ep.dispatch(np.zeros((0, 3), np.float32), np.zeros((0, 2), np.int32), np.zeros((0, 2), np.float32))
        np.testing.assert_array_equal(np.from_dlpack(r.recv_counts), [0])
        y = ep.combine(r.hidden_states)
        assert y.shape == (0, 3)
        assert np.from_dlpack(y).shape == (0, 3)


def test_callback_exception_becomes_the_cause():
    class Boom(Exception):
        pass

    def allgather(send, recv, n):
        raise Boom("allgather exploded")

    bs = moe_ep.CallbackBootstrap(0, 1, allgather, lambda: None)
    with pytest.raises(moe_ep.MoeEpError) as e:
        moe_ep.MoeEp(bs, num_experts=4, top_k=2, max_tokens_per_rank=8, hidden_size=3, backend="host")
    assert e.value.status == moe_ep.ERROR_BOOTSTRAP
    assert isinstance(e.value.__cause__, Boom)


def test_library_override_env_is_honoured():
    # The loaded library is the one the environment named (CTest sets it).
    path = os.environ.get("MOE_EP_LIBRARY")
    if not path:
        pytest.skip("MOE_EP_LIBRARY not set")
    assert _lib.lib().loaded_from == path


def _header_backends():
    """MOE_EP_BACKEND_* name -> value, read from the public header."""
    with open(os.path.join(REPO, "include", "moe_ep_c.h")) as f:
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"MOE_EP_BACKEND_(\w+)\s*=\s*(\d+)", f.read())}


def test_backend_constants_and_names_match_the_header():
    header = _header_backends()
    assert set(header) == {"AUTO", "NVLINK_TWO_SIDED", "HOST", "NCCL"}
    for name, value in header.items():
        assert getattr(moe_ep, "BACKEND_" + name) == value
    for name, value in (("auto", "AUTO"), ("nvlink", "NVLINK_TWO_SIDED"), ("host", "HOST"), ("nccl", "NCCL")):
        assert moe_ep.core.make_config(backend=name).backend == header[value]


def test_last_path_names_the_path_of_each_phase():
    x, ids, w = inputs()
    with small_ep() as ep:
        assert ep.last_path("dispatch") == "none" and ep.last_path("combine") == "none"
        r = ep.dispatch(x, ids, w)
        assert ep.last_path("dispatch") == "host"
        assert ep.last_path("combine") == "none"
        ep.combine(r.hidden_states)
        assert ep.last_path("combine") == "host"
        for bad in ("send", 0, None):
            with pytest.raises(ValueError, match="phase must be 'dispatch' or 'combine'"):
                ep.last_path(bad)
    with pytest.raises(moe_ep.MoeEpError):
        ep.last_path("dispatch")  # destroyed


def test_path_names_match_the_header():
    with open(os.path.join(REPO, "include", "moe_ep_c.h")) as f:
        header = {m.group(1): int(m.group(2)) for m in re.finditer(r"MOE_EP_PATH_(\w+)\s*=\s*(\d+)", f.read())}
    assert header["NONE"] == 0 and header["HOST"] == 1
    for name, value in header.items():
        assert _lib.lib().moe_ep_path_name(value).decode() == name.lower()
    assert _lib.lib().moe_ep_path_name(-1).decode() == "unknown"
    with open(os.path.join(REPO, "include", "moe_ep_c.h")) as f:
        phases = {m.group(1): int(m.group(2)) for m in re.finditer(r"MOE_EP_PHASE_(\w+)\s*=\s*(\d+)", f.read())}
    assert phases == {"DISPATCH": _lib.PHASE_DISPATCH, "COMBINE": _lib.PHASE_COMBINE}
    with open(os.path.join(REPO, "bindings", "rust", "moe-ep-sys", "src", "lib.rs")) as f:
        rust = f.read()
    assert {m.group(1): int(m.group(2))
            for m in re.finditer(r"pub const MOE_EP_PATH_(\w+): i32 = (\d+);", rust)} == header
    assert {m.group(1): int(m.group(2))
            for m in re.finditer(r"pub const MOE_EP_PHASE_(\w+): i32 = (\d+);", rust)} == phases
    with open(os.path.join(REPO, "bindings", "julia", "MoeEp", "src", "MoeEp.jl")) as f:
        julia = {m.group(1): int(m.group(2)) for m in re.finditer(r"const PHASE_(\w+) = Int32\((\d+)\)", f.read())}
    assert julia == phases


def test_julia_and_rust_backend_constants_match_the_header():
    header = _header_backends()
    with open(os.path.join(REPO, "bindings", "julia", "MoeEp", "src", "MoeEp.jl")) as f:
        julia = {m.group(1): int(m.group(2)) for m in re.finditer(r"const BACKEND_(\w+) = Int32\((\d+)\)", f.read())}
    with open(os.path.join(REPO, "bindings", "rust", "moe-ep-sys", "src", "lib.rs")) as f:
        rust = {m.group(1): int(m.group(2)) for m in re.finditer(r"pub const MOE_EP_BACKEND_(\w+): i32 = (\d+);", f.read())}
    assert julia == header
    assert rust == header
