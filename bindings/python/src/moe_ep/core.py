"""The handle: create, dispatch, combine, async errors, health and the active-rank mask, destroy."""

import collections
import ctypes
import warnings

from . import _dlpack, _lib
from ._errors import MoeEpError, check
from ._views import DispatchResult, View
from .bootstrap import CallbackBootstrap, _abandon, _text

_DTYPES = {
    "bfloat16": (_lib.DTYPE_BFLOAT, 16, 1), "bf16": (_lib.DTYPE_BFLOAT, 16, 1),
    "float16": (_lib.DTYPE_FLOAT, 16, 1), "fp16": (_lib.DTYPE_FLOAT, 16, 1), "half": (_lib.DTYPE_FLOAT, 16, 1),
    "float32": (_lib.DTYPE_FLOAT, 32, 1), "fp32": (_lib.DTYPE_FLOAT, 32, 1), "float": (_lib.DTYPE_FLOAT, 32, 1),
    "float64": (_lib.DTYPE_FLOAT, 64, 1),
    "float8_e4m3fn": (_lib.DTYPE_FLOAT8_E4M3FN, 8, 1),
    "float8_e5m2": (_lib.DTYPE_FLOAT8_E5M2, 8, 1),
    "float4_e2m1fn": (_lib.DTYPE_FLOAT4_E2M1FN, 4, 1),
    "int8": (_lib.DTYPE_INT, 8, 1), "int16": (_lib.DTYPE_INT, 16, 1),
    "int32": (_lib.DTYPE_INT, 32, 1), "int64": (_lib.DTYPE_INT, 64, 1),
    "uint8": (_lib.DTYPE_UINT, 8, 1), "uint16": (_lib.DTYPE_UINT, 16, 1),
    "uint32": (_lib.DTYPE_UINT, 32, 1),
}

_LAYOUTS = {"rank_major": _lib.LAYOUT_RANK_MAJOR, "expert_major": _lib.LAYOUT_EXPERT_MAJOR,
            "expert_packed": _lib.LAYOUT_EXPERT_PACKED}
_SCALE_LAYOUTS = {"row_major": _lib.SCALES_ROW_MAJOR, "column_major": _lib.SCALES_COLUMN_MAJOR}
_WIRES = {"as_is": _lib.WIRE_AS_IS, "fp8_e4m3_block128": _lib.WIRE_FP8_E4M3_BLOCK128}
_WIRE_SCALES = {"fp32": _lib.WIRE_SCALE_FP32, "ue8m0": _lib.WIRE_SCALE_UE8M0}

_FAILURE_POLICIES = {"fail_handle": _lib.ON_FAILURE_FAIL_HANDLE, "mask": _lib.ON_FAILURE_MASK}

_BACKENDS = {"auto": _lib.BACKEND_AUTO, "nvlink": _lib.BACKEND_NVLINK_TWO_SIDED,
             "nvlink_two_sided": _lib.BACKEND_NVLINK_TWO_SIDED, "host": _lib.BACKEND_HOST,
             "nccl": _lib.BACKEND_NCCL}


Health = collections.namedtuple("Health", ["status", "error", "failed_rank", "active_count", "mask_epoch"])
Health.__doc__ = """What MoeEp.poll_health() reports (moe_ep_health_t): status (an int,
moe_ep.SUCCESS when healthy), error (a MoeEpError with the library's message,
None when healthy), failed_rank (-1 when none is known), active_count,
mask_epoch."""


def dtype_tuple(dtype):
    """(code, bits, lanes) from a name ("bfloat16"), a numpy dtype or type, a
    torch dtype, or a (code, bits[, lanes]) tuple."""
    if isinstance(dtype, tuple):
        return (int(dtype[0]), int(dtype[1]), int(dtype[2]) if len(dtype) > 2 else 1)
    if isinstance(getattr(dtype, "name", None), str):  # numpy.dtype
        name = dtype.name
    elif isinstance(dtype, type):  # numpy.float32
        name = dtype.__name__
    else:  # "float32", torch.bfloat16 -> "torch.bfloat16"
        name = str(dtype).rsplit(".", 1)[-1]
    try:
        return _DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"moe_ep: unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} "
                         "or a (code, bits, lanes) tuple") from None


def _dtype_of(field):
    return (field.code, field.bits, field.lanes)


def _set_dtype(field, dtype):
    field.code, field.bits, field.lanes = dtype_tuple(dtype)


def make_params(num_experts, top_k, max_tokens_per_rank, hidden_size, hidden_dtype=None,
                hidden_row_elems=None, scale_row_elems=None, scale_dtype=None, invalid_expert_id=None,
                enable_eplb_stats=None, combine_dtype=None, receive_layout=None, expert_capacity=None,
                expert_alignment=None, expert_rows=None, expert_output_weighted=None, scale_layout=None,
                dispatch_wire=None, combine_wire=None, wire_scale=None, dispatch_dequantize=None):
    """A moe_ep_params_t; arguments left as None keep moe_ep_params_init's defaults.
    receive_layout: "rank_major", "expert_major", "expert_packed" or a
    MOE_EP_LAYOUT_* int; scale_layout: "row_major", "column_major" or a
    MOE_EP_SCALES_* int; dispatch_wire, combine_wire: "as_is",
    "fp8_e4m3_block128" or a MOE_EP_WIRE_* int; wire_scale: "fp32", "ue8m0" or
    a MOE_EP_WIRE_SCALE_* int."""
    p = _lib.Params()
    check(_lib.lib().moe_ep_params_init(ctypes.byref(p), ctypes.sizeof(p)))
    p.num_experts, p.top_k = num_experts, top_k
    p.max_tokens_per_rank, p.hidden_size = max_tokens_per_rank, hidden_size
    if hidden_dtype is not None:
        _set_dtype(p.hidden_dtype, hidden_dtype)
    if hidden_row_elems is not None:
        p.hidden_row_elems = hidden_row_elems
    if scale_row_elems is not None:
        p.scale_row_elems = scale_row_elems
    if scale_dtype is not None:
        _set_dtype(p.scale_dtype, scale_dtype)
    if invalid_expert_id is not None:
        p.invalid_expert_id = invalid_expert_id
    if enable_eplb_stats is not None:
        p.enable_eplb_stats = int(bool(enable_eplb_stats))
    if combine_dtype is not None:
        _set_dtype(p.combine_dtype, combine_dtype)
    if receive_layout is not None:
        p.receive_layout = _enum_value(receive_layout, _LAYOUTS, "receive_layout", "MOE_EP_LAYOUT_*")
    for name, value in (("expert_capacity", expert_capacity), ("expert_alignment", expert_alignment),
                        ("expert_rows", expert_rows)):
        if value is not None:
            setattr(p, name, _int32(value, name))
    if expert_output_weighted is not None:
        p.expert_output_weighted = int(bool(expert_output_weighted))
    if scale_layout is not None:
        p.scale_layout = _enum_value(scale_layout, _SCALE_LAYOUTS, "scale_layout", "MOE_EP_SCALES_*")
    if dispatch_wire is not None:
        p.dispatch_wire = _enum_value(dispatch_wire, _WIRES, "dispatch_wire", "MOE_EP_WIRE_*")
    if combine_wire is not None:
        p.combine_wire = _enum_value(combine_wire, _WIRES, "combine_wire", "MOE_EP_WIRE_*")
    if wire_scale is not None:
        p.wire_scale = _enum_value(wire_scale, _WIRE_SCALES, "wire_scale", "MOE_EP_WIRE_SCALE_*")
    if dispatch_dequantize is not None:
        p.dispatch_dequantize = int(bool(dispatch_dequantize))
    return p


def _enum_value(value, names, what, c_names):
    """A name of `names` (case-insensitive) or an int; the library checks the
    int's range and names the field when it is out of it."""
    if isinstance(value, str):
        try:
            return names[value.lower()]
        except KeyError:
            raise ValueError(f"moe_ep: unknown {what} {value!r}; expected one of "
                             f"{', '.join(repr(k) for k in names)} or a {c_names} int") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"moe_ep: {what} must be a name ({', '.join(repr(k) for k in names)}) "
                         f"or a {c_names} int, got {value!r}")
    return _int32(value, what)


def make_config(backend=None, num_sms=None, timeout_ms=None, device=None, zero_copy_combine=None,
                micro_batches=None, failure_policy=None, rejoin=None, store_address=None, store_prefix=None):
    """A moe_ep_config_t; None keeps moe_ep_config_init's defaults.  backend:
    "auto", "host", "nvlink", "nccl" or a MOE_EP_BACKEND_* int;
    failure_policy: "fail_handle", "mask" or a MOE_EP_ON_FAILURE_* int;
    store_address, store_prefix: str, referenced by the returned struct (the
    library copies them at create)."""
    c = _lib.Config()
    check(_lib.lib().moe_ep_config_init(ctypes.byref(c), ctypes.sizeof(c)))
    if backend is not None:
        c.backend = _backend_value(backend)
    if num_sms is not None:
        c.num_sms = num_sms
    if timeout_ms is not None:
        c.timeout_ms = timeout_ms
    if device is not None:
        c.device = device
    if zero_copy_combine is not None:
        c.zero_copy_combine = int(bool(zero_copy_combine))
    if micro_batches is not None:
        c.micro_batches = _int32(micro_batches, "micro_batches")
    if failure_policy is not None:
        c.failure_policy = _enum_value(failure_policy, _FAILURE_POLICIES, "failure_policy", "MOE_EP_ON_FAILURE_*")
    if rejoin is not None:
        c.rejoin = int(bool(rejoin))
    # Assigned as bytes: the struct keeps them referenced, so the pointers
    # stay valid for as long as the struct (the handle keeps its config).
    if store_address is not None:
        c.store_address = _text(store_address, "store_address")
    if store_prefix is not None:
        c.store_prefix = _text(store_prefix, "store_prefix")
    return c


def _int32(value, name):
    """An int argument for an int32_t parameter, refused (not wrapped) when
    it is no int or does not fit."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"{name}: expected an int, got {value!r}")
    if not -2**31 <= value < 2**31:
        raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"{name}: expected a 32-bit int, got {value}")
    return value


def _backend_value(backend):
    if isinstance(backend, str):
        try:
            return _BACKENDS[backend.lower()]
        except KeyError:
            raise ValueError(f"moe_ep: unknown backend {backend!r}; expected one of "
                             f"{', '.join(repr(k) for k in _BACKENDS)} or a MOE_EP_BACKEND_* int") from None
    if isinstance(backend, bool) or not isinstance(backend, int):
        raise ValueError(f"moe_ep: backend must be a name ({', '.join(repr(k) for k in _BACKENDS)}) "
                         f"or a MOE_EP_BACKEND_* int, got {backend!r}")
    return int(backend)


_CONFIG_KEYS = ("backend", "num_sms", "timeout_ms", "device", "zero_copy_combine", "micro_batches",
                "failure_policy", "rejoin", "store_address", "store_prefix")


def _split_kwargs(kwargs):
    config = {k: kwargs.pop(k) for k in _CONFIG_KEYS if k in kwargs}
    return kwargs, config


def _stream_int(stream):
    """cudaStream_t as an int from None/0 (legacy default stream), an int, a
    torch.cuda.Stream (.cuda_stream) or a cupy stream (.ptr)."""
    if stream is None:
        return 0
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


def get_version():
    """(major, minor, patch) of the loaded library."""
    v = [ctypes.c_int32() for _ in range(3)]
    check(_lib.lib().moe_ep_get_version(*(ctypes.byref(x) for x in v)))
    return tuple(x.value for x in v)


def is_platform_supported(device=0):
    """Whether the NVLINK_TWO_SIDED backend can run on CUDA device `device`
    (False without a GPU or driver).  Local, no collective."""
    s = ctypes.c_int32(-1)
    check(_lib.lib().moe_ep_is_platform_supported(int(device), ctypes.byref(s)))
    return bool(s.value)


def workspace_size(world_size, **kwargs):
    """Bytes create() would allocate per rank; takes MoeEp's keyword arguments."""
    params_kw, config_kw = _split_kwargs(dict(kwargs))
    p = make_params(**params_kw)
    c = make_config(**config_kw)
    n = ctypes.c_uint64()
    check(_lib.lib().moe_ep_workspace_size(ctypes.byref(p), ctypes.byref(c), int(world_size),
                                           ctypes.byref(n)))
    return n.value


class MoeEp:
    """One moe_ep handle: collective create, dispatch, combine and destroy.

        with moe_ep.MoeEp(bootstrap, num_experts=8, top_k=2, max_tokens_per_rank=64,
                          hidden_size=128, hidden_dtype="float32",
                          combine_dtype="float32", backend="host") as ep:
            r = ep.dispatch(x, topk_ids, topk_weights)
            y = ep.combine(expert_output)

    Required (the same on every rank):
      bootstrap            -- a Bootstrap (from_mpi4py(), from_torch_distributed(),
                              SingleRankBootstrap(), CallbackBootstrap(...))
      num_experts          -- E > 0, divisible by the number of ranks
      top_k                -- K, experts per token, 1..E
      max_tokens_per_rank  -- the largest T (tokens of one rank) of any call
      hidden_size          -- H, elements per row of combine's tensors

    Optional (None keeps the library's default):
      hidden_dtype         -- dispatch payload dtype, default "bfloat16"
      hidden_row_elems     -- elements per dispatched row R, default H
      scale_row_elems      -- S, per-row scales sent with the rows, default 0
      scale_dtype          -- default "float32"
      invalid_expert_id    -- default -1
      enable_eplb_stats    -- default False
      combine_dtype        -- "bfloat16" (default), "float16" or "float32"
      receive_layout       -- how dispatch lays out the received rows
                              (docs/semantics.md, "Receive layouts"):
                              "rank_major" (default), "expert_major" (one
                              [capacity, R] segment per local expert) or
                              "expert_packed" (experts' rows back to back at
                              aligned offsets), on every backend
      expert_capacity      -- expert_major: rows per local expert, default
                              world_size * max_tokens_per_rank
      expert_alignment     -- expert_packed: row alignment of every expert's
                              first row, 1..256, default 1
      expert_rows          -- expert_packed: rows of the result, a multiple of
                              expert_alignment, default the worst case
      expert_output_weighted -- expert layouts: True if the expert output
                              already carries the pick weights (combine then
                              does not multiply by row_weights); default False
      scale_layout         -- expert layouts with scales: "row_major" (default)
                              or "column_major" (fp32 scales, the TMA-aligned
                              layout of grouped FP8 GEMMs)
      dispatch_wire        -- what dispatch moves between ranks (docs/semantics.md,
                              "A low-precision wire"): "as_is" (default: the rows
                              as given) or "fp8_e4m3_block128" (the library
                              quantizes bf16/fp16/fp32 rows to e4m3 with one
                              scale per 128 elements; scale_row_elems must be
                              0).  The result's hidden_states are then
                              float8_e4m3fn [P, R] and hidden_states_scale
                              float32 [P, ceil(R / 128)] (expert layouts: their
                              shapes), unless dispatch_dequantize
      combine_wire         -- "as_is" (default) or "fp8_e4m3_block128": each
                              rank's rows cross as e4m3 and are dequantized to
                              fp32 before the ordered sum; combine's tensors
                              do not change
      wire_scale           -- with an FP8 wire: "fp32" (default, amax / 448) or
                              "ue8m0" (the power of two at or above it)
      dispatch_dequantize  -- with an FP8 dispatch wire: True gives the rows
                              dequantized back to hidden_dtype, no scales;
                              default False
      backend              -- "auto" (default), "nvlink", "nccl" or "host"
      num_sms, timeout_ms, device -- see moe_ep_config_t in moe_ep_c.h
      zero_copy_combine    -- default False; True: every DispatchResult has
                              combine_input, a writable [P, H] view to write the
                              expert output into and pass to combine (no copy)
      micro_batches        -- 1 (default) or 2: buffer slots for the split
                              calls dispatch_send/dispatch_recv/combine_send/
                              combine_recv, one micro-batch in flight per slot
      failure_policy       -- what a peer that stops answering does
                              (docs/reliability.md, "Surviving a dead rank"):
                              "fail_handle" (default: TIMEOUT, the handle is
                              unusable) or "mask" (HOST backend: the survivors
                              drop the failed rank through the store and go on;
                              the failing call raises MoeEpError TIMEOUT naming
                              it, poll_health() shows failed_rank and the new
                              mask_epoch); the same on every rank
      store_address        -- "host:port" of a moe_ep.Store, needed by "mask"
      store_prefix         -- the group's name in the store, default "moe_ep";
                              groups sharing a store need distinct prefixes
      rejoin               -- True: this process replaces a failed rank of a
                              running "mask" group (bootstrap: a
                              RejoinBootstrap(rank, world_size)); create
                              returns once the survivors admit it with
                              set_active_ranks

    dtypes are names ("bfloat16"), numpy/torch dtypes or (code, bits, lanes).
    Tensors are any objects with __dlpack__; see dispatch() and combine().
    """

    def __init__(self, bootstrap, num_experts, top_k, max_tokens_per_rank, hidden_size, *,
                 hidden_dtype=None, hidden_row_elems=None, scale_row_elems=None, scale_dtype=None,
                 invalid_expert_id=None, enable_eplb_stats=None, combine_dtype=None,
                 receive_layout=None, expert_capacity=None, expert_alignment=None, expert_rows=None,
                 expert_output_weighted=None, scale_layout=None, dispatch_wire=None, combine_wire=None,
                 wire_scale=None, dispatch_dequantize=None, backend=None, num_sms=None, timeout_ms=None,
                 device=None, zero_copy_combine=None, micro_batches=None, failure_policy=None, rejoin=None,
                 store_address=None, store_prefix=None):
        self._params = make_params(num_experts, top_k, max_tokens_per_rank, hidden_size,
                                   hidden_dtype=hidden_dtype, hidden_row_elems=hidden_row_elems,
                                   scale_row_elems=scale_row_elems, scale_dtype=scale_dtype,
                                   invalid_expert_id=invalid_expert_id,
                                   enable_eplb_stats=enable_eplb_stats, combine_dtype=combine_dtype,
                                   receive_layout=receive_layout, expert_capacity=expert_capacity,
                                   expert_alignment=expert_alignment, expert_rows=expert_rows,
                                   expert_output_weighted=expert_output_weighted, scale_layout=scale_layout,
                                   dispatch_wire=dispatch_wire, combine_wire=combine_wire,
                                   wire_scale=wire_scale, dispatch_dequantize=dispatch_dequantize)
        self._config = make_config(backend=backend, num_sms=num_sms, timeout_ms=timeout_ms,
                                   device=device, zero_copy_combine=zero_copy_combine,
                                   micro_batches=micro_batches, failure_policy=failure_policy, rejoin=rejoin,
                                   store_address=store_address, store_prefix=store_prefix)
        self._bootstrap = bootstrap  # destroy calls back into it
        # A MASK handle calls the bootstrap's callbacks during create only
        # (afterwards it exchanges through the store).
        self._callbacks_after_create = self._config.failure_policy != _lib.ON_FAILURE_MASK
        self._ptr = _lib.HandlePtr()
        # Per (phase, slot): bumped when that slot's views expire (dispatch:
        # its combine_send; combine: its next combine_recv).
        self._epochs = collections.defaultdict(int)
        # Per slot: the inputs the library may still read on the stream.
        self._keep_dispatch = {}
        self._keep_combine = {}
        status = _lib.lib().moe_ep_create(ctypes.byref(bootstrap.struct), ctypes.byref(self._params),
                                          ctypes.byref(self._config), ctypes.byref(self._ptr))
        self._check_with_bootstrap(status, in_create=True)

    def _check_with_bootstrap(self, status, in_create=False):
        if status == _lib.ERROR_TIMEOUT and (in_create or self._callbacks_after_create):
            # A callback may still be running on the handle's exchange thread
            # and will use the bootstrap when it returns: keep it for good.
            _abandon(self._bootstrap)
        try:
            check(status)
        except MoeEpError as e:
            cause = self._bootstrap.take_exception() if isinstance(self._bootstrap, CallbackBootstrap) else None
            if cause is not None:
                raise e from cause
            raise

    # -- properties ---------------------------------------------------------------
    @property
    def rank(self):
        return self._bootstrap.rank

    @property
    def world_size(self):
        return self._bootstrap.world_size

    @property
    def num_experts(self):
        return self._params.num_experts

    @property
    def top_k(self):
        return self._params.top_k

    @property
    def hidden_size(self):
        return self._params.hidden_size

    @property
    def invalid_expert_id(self):
        return self._params.invalid_expert_id

    @property
    def receive_layout(self):
        """The receive layout: "rank_major", "expert_major" or "expert_packed"."""
        return {v: k for k, v in _LAYOUTS.items()}[self._params.receive_layout]

    @property
    def closed(self):
        return self._ptr.value is None

    def _live(self):
        if self._ptr.value is None:
            raise MoeEpError(_lib.ERROR_INVALID_STATE, "this moe_ep handle was destroyed")
        return self._ptr

    # -- calls ------------------------------------------------------------------------
    def dispatch(self, hidden_states, topk_ids, topk_weights=None, hidden_states_scale=None,
                 runtime_max_tokens_per_rank=0, eplb_local_stats=None, stream=None):
        """Collective: sends each token to every rank that owns one of its experts.

        T = tokens on this rank (0..max_tokens_per_rank, may differ per rank),
        K = top_k, R = hidden_row_elems (default hidden_size), S = scale_row_elems.
          hidden_states        [T, R] hidden_dtype.  numpy users: for bf16/fp16/fp8
                               payloads pass an ml_dtypes array (ml_dtypes.bfloat16)
                               or an integer array of the same width (uint16 for
                               bf16/fp16, uint8 for fp8) holding the raw bits.
          topk_ids             [T, K] int32, expert ids; invalid_expert_id = no pick
          topk_weights         [T, K] float32, optional
          hidden_states_scale  [T, S] scale_dtype, required iff S > 0
          runtime_max_tokens_per_rank  0 = max_tokens_per_rank
          eplb_local_stats     [E] int32, optional
          stream               cudaStream_t as an int, a torch/cupy stream, or None
        Inputs are only read: read-only arrays are fine.  CPU tensors for the
        HOST backend, CUDA tensors on the handle's device otherwise.

        Returns a DispatchResult of Views, valid until the matching combine is
        issued, with P = world_size * tokens_per_rank receive rows (rank-major):
          hidden_states [P, R], topk_ids [P, K] int32 (picks of other ranks are
          invalid_expert_id), topk_weights [P, K] float32 (if given),
          hidden_states_scale [P, S], recv_counts [world_size] int32,
          local_expert_counts [E / world_size] int32, eplb_gathered_stats
          [world_size, E] int32 (if enabled), combine_input [P, H]
          combine_dtype (if zero_copy_combine): write the expert output into
          it (host: r.combine_input.write(y); CUDA: through
          torch.from_dlpack(r.combine_input)) and pass r.combine_input to
          combine as expert_output.

        In an expert layout (receive_layout "expert_major" or "expert_packed")
        a row is one (source token, pick of a local expert), El = E / world_size:
          hidden_states [El, capacity, R] or [expert_rows, R];
          hidden_states_scale row-aligned ([El, capacity, S] / [expert_rows, S])
          or, with scale_layout="column_major", [El, S, align4(capacity)] /
          [S, align4(expert_rows)]; topk_ids and topk_weights are None;
          expert_counts [El] int32 (rows written per local expert),
          expert_offsets [El + 1] int32 (expert_packed: each expert's first
          row, [El] the aligned total), row_sources [rows, 3] int32 (source
          rank, source token, pick index; -1 on padding), row_weights [rows]
          float32 (the pick's weight, 1.0 without topk_weights, 0 on padding),
          dropped_pairs [1] int32 (pairs beyond the capacity or expert_rows:
          counted, never written); combine_input has the layout's rows.  In
          rank_major these five are None.

        With dispatch_wire="fp8_e4m3_block128" (and dispatch_dequantize
        False) hidden_states is float8_e4m3fn (e4m3 codes) and
        hidden_states_scale float32 with ceil(R / 128) scales per row in
        place of S.  numpy reads the codes with view.numpy() (an
        ml_dtypes.float8_e4m3fn array) or np.from_dlpack(view.view_as("uint8"))
        (raw bits); hidden_states_scale must then not be given."""
        handle = self._live()
        s = _stream_int(stream)
        args, keep = self._dispatch_args(s, hidden_states, topk_ids, topk_weights, hidden_states_scale,
                                         runtime_max_tokens_per_rank, eplb_local_stats)
        result = _lib.DispatchResult()
        check(_lib.lib().moe_ep_dispatch_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        self._check_with_bootstrap(
            _lib.lib().moe_ep_dispatch(handle, ctypes.byref(args), ctypes.byref(result), s))
        # The library may still read the inputs on `stream` (CUDA backend):
        # keep their producers alive until the next dispatch replaces them.
        self._keep_dispatch[0] = keep
        return DispatchResult(self, result, 0)

    def _dispatch_args(self, s, hidden_states, topk_ids, topk_weights, hidden_states_scale,
                       runtime_max_tokens_per_rank, eplb_local_stats):
        args = _lib.DispatchArgs()
        check(_lib.lib().moe_ep_dispatch_args_init(ctypes.byref(args), ctypes.sizeof(args)))
        keep = []
        p = self._params
        expected = {"hidden_states": _dtype_of(p.hidden_dtype),
                    "hidden_states_scale": _dtype_of(p.scale_dtype)}
        for name, obj in (("hidden_states", hidden_states), ("topk_ids", topk_ids),
                          ("topk_weights", topk_weights), ("hidden_states_scale", hidden_states_scale),
                          ("eplb_local_stats", eplb_local_stats)):
            if obj is not None:
                b = _dlpack.borrow(obj, s, name, expect=expected.get(name))
                setattr(args, name, b.ptr)
                keep.append(b)
        args.runtime_max_tokens_per_rank = int(runtime_max_tokens_per_rank)
        return args, keep

    def combine(self, expert_output, output=None, stream=None):
        """Collective: returns each rank's expert output to the tokens' source
        ranks and sums it over ranks (ascending rank order, fp32 accumulation).

          expert_output  [P, H] or [world_size, tokens_per_rank, H] combine_dtype:
                         row i is the output for receive row i of the matching
                         dispatch (already weighted and summed over this rank's
                         experts).  An integer array of the same width is read as
                         raw bits for bf16/fp16 (numpy), as are ml_dtypes arrays.
                         In an expert layout: the dispatch's layout, [El,
                         capacity, H] (or [El * capacity, H]) or [expert_rows, H],
                         one row per expert row, unweighted: combine multiplies
                         each by its row_weights entry and sums a token's rows in
                         ascending (local expert, pick) order in fp32 (not with
                         expert_output_weighted=True: then the rows are added
                         as they are).
          output         [T, H] combine_dtype, writable, optional
          stream         as for dispatch
        Returns `output` if given, else a View [T, H] of library-owned memory
        valid until the next combine.  Issuing combine ends the validity of the
        dispatch result's views."""
        handle = self._live()
        s = _stream_int(stream)
        combine_dtype = _dtype_of(self._params.combine_dtype)
        keep = [_dlpack.borrow(expert_output, s, "expert_output", expect=combine_dtype)]
        out_keep, out_ptr = self._combine_output(s, output)
        keep += out_keep
        result = _lib.CombineResult()
        check(_lib.lib().moe_ep_combine_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        self._check_with_bootstrap(
            _lib.lib().moe_ep_combine(handle, keep[0].ptr, out_ptr, ctypes.byref(result), s))
        # Issued: the dispatch views and any earlier library-owned output expire.
        self._epochs[("dispatch", 0)] += 1
        self._epochs[("combine", 0)] += 1
        self._keep_combine[0] = keep
        if output is not None:
            return output
        return View(self, ("combine", 0), result.output)

    def _combine_output(self, s, output):
        if output is None:
            return [], None
        b = _dlpack.borrow(output, s, "output", expect=_dtype_of(self._params.combine_dtype))
        if b.readonly:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT,
                             "output: expected a writable tensor, got a read-only DLPack export")
        return [b], b.ptr

    # -- split phases (docs/overlap.md) ------------------------------------------
    # Each slot (0 .. micro_batches - 1) goes IDLE -dispatch_send-> DISPATCH_SENT
    # -dispatch_recv-> DISPATCHED -combine_send-> COMBINE_SENT -combine_recv->
    # IDLE; any other call on it raises MoeEpError(INVALID_STATE) and leaves the
    # handle usable.  dispatch() is dispatch_send + dispatch_recv on slot 0,
    # combine() combine_send + combine_recv on slot 0.

    def dispatch_send(self, hidden_states, topk_ids, topk_weights=None, hidden_states_scale=None,
                      runtime_max_tokens_per_rank=0, eplb_local_stats=None, slot=0, stream=None):
        """Collective: the send half of dispatch on `slot`; returns once the
        rows are on their way.  Arguments as for dispatch().  The inputs are
        kept alive until the slot's next dispatch_send."""
        handle = self._live()
        slot = _int32(slot, "slot")
        s = _stream_int(stream)
        args, keep = self._dispatch_args(s, hidden_states, topk_ids, topk_weights, hidden_states_scale,
                                         runtime_max_tokens_per_rank, eplb_local_stats)
        self._check_with_bootstrap(_lib.lib().moe_ep_dispatch_send(handle, slot, ctypes.byref(args), s))
        self._keep_dispatch[slot] = keep
        return None

    def dispatch_recv(self, slot=0, stream=None):
        """Collective: the receive half of dispatch on `slot`: waits for the
        rows (bounded by timeout_ms) and returns the same DispatchResult as
        dispatch(), the same bits.  Its views stay valid until the slot's
        combine_send (or combine) is issued."""
        handle = self._live()
        slot = _int32(slot, "slot")
        s = _stream_int(stream)
        result = _lib.DispatchResult()
        check(_lib.lib().moe_ep_dispatch_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        self._check_with_bootstrap(_lib.lib().moe_ep_dispatch_recv(handle, slot, ctypes.byref(result), s))
        return DispatchResult(self, result, slot)

    def combine_send(self, expert_output, slot=0, stream=None):
        """Collective: the send half of combine on `slot`.  expert_output as
        for combine(); it may be the slot's combine_input view.  Issuing it
        ends the validity of the slot's dispatch views."""
        handle = self._live()
        slot = _int32(slot, "slot")
        s = _stream_int(stream)
        keep = [_dlpack.borrow(expert_output, s, "expert_output", expect=_dtype_of(self._params.combine_dtype))]
        self._check_with_bootstrap(_lib.lib().moe_ep_combine_send(handle, slot, keep[0].ptr, s))
        self._epochs[("dispatch", slot)] += 1
        self._keep_combine[slot] = keep
        return None

    def combine_recv(self, slot=0, output=None, stream=None):
        """Collective: the receive half of combine on `slot`: waits for the
        rows and sums them, the same bits as combine().  Returns `output` if
        given, else a View [T, H] of library-owned memory valid until the
        slot's next combine_recv (or, on slot 0, combine)."""
        handle = self._live()
        slot = _int32(slot, "slot")
        s = _stream_int(stream)
        out_keep, out_ptr = self._combine_output(s, output)
        result = _lib.CombineResult()
        check(_lib.lib().moe_ep_combine_result_init(ctypes.byref(result), ctypes.sizeof(result)))
        self._check_with_bootstrap(
            _lib.lib().moe_ep_combine_recv(handle, slot, out_ptr, ctypes.byref(result), s))
        self._epochs[("combine", slot)] += 1
        self._keep_combine.setdefault(slot, []).extend(out_keep)
        if output is not None:
            return output
        return View(self, ("combine", slot), result.output)

    @property
    def backend(self):
        """The backend this handle runs on ("nvlink", "host" or "nccl"): what
        "auto" chose, the same on every rank.  HOST takes CPU arrays, the others
        arrays on the handle's GPU."""
        value = ctypes.c_int32(-1)
        check(_lib.lib().moe_ep_get_backend(self._live(), ctypes.byref(value)))
        return {_lib.BACKEND_NVLINK_TWO_SIDED: "nvlink", _lib.BACKEND_HOST: "host",
                _lib.BACKEND_NCCL: "nccl"}[value.value]

    def last_path(self, phase):
        """The path this handle's last call of `phase` ("dispatch" or
        "combine") took on this rank, by name: "host", "nccl",
        "dispatch_small", "combine_overlapped_push", ... ("none" before the
        first such call).  Which kernels and schedule the library chose;
        results are the same on every path.  Local, no synchronisation."""
        phases = {"dispatch": _lib.PHASE_DISPATCH, "combine": _lib.PHASE_COMBINE}
        if not isinstance(phase, str) or phase not in phases:
            raise ValueError(f"moe_ep: phase must be 'dispatch' or 'combine', got {phase!r}")
        value = ctypes.c_int32(-1)
        check(_lib.lib().moe_ep_get_last_path(self._live(), phases[phase], ctypes.byref(value)))
        return _lib.lib().moe_ep_path_name(value.value).decode()

    def async_error(self):
        """The first device-side error since the last check (synchronises with
        the handle's work) as a MoeEpError, or None."""
        status = ctypes.c_int32(-1)
        check(_lib.lib().moe_ep_get_async_error(self._live(), ctypes.byref(status)))
        if status.value == _lib.SUCCESS:
            return None
        return MoeEpError(status.value, _lib.lib().moe_ep_last_error().decode(errors="replace"))

    def check_async_error(self):
        """Raises the first device-side error since the last check, if any."""
        err = self.async_error()
        if err is not None:
            raise err

    # -- health and the active-rank mask (docs/semantics.md, "Active ranks") -------
    def poll_health(self):
        """The handle's health from host memory only: never synchronises with
        the device, never waits for a peer, never blocks (cheap enough to call
        every step).  Returns a Health: status (SUCCESS or the sticky TIMEOUT,
        CUDA or INTERNAL that broke the handle), error (that status as a
        MoeEpError with its message, or None), failed_rank (the peer a timeout
        named, -1 when none is known; on HOST and NCCL set only by failure_policy
        "mask", the lowest rank the survivors dropped), active_count
        (ranks active in the mask) and mask_epoch (0 at create, +1 per
        set_active_ranks).  Device errors only a synchronising query finds
        (bad expert ids) stay with async_error().  Local."""
        health = _lib.Health()
        check(_lib.lib().moe_ep_health_init(ctypes.byref(health), ctypes.sizeof(health)))
        check(_lib.lib().moe_ep_poll_health(self._live(), ctypes.byref(health)))
        error = None
        if health.status != _lib.SUCCESS:  # the failure's message, set by the poll
            error = MoeEpError(health.status, _lib.lib().moe_ep_last_error().decode(errors="replace"))
        return Health(health.status, error, health.failed_rank, health.active_count, health.mask_epoch)

    def active_ranks(self):
        """The current mask as a list of world_size bools: True if the rank is
        active.  Local, non-blocking."""
        n = self.world_size
        mask = (ctypes.c_uint8 * max(n, 1))()
        check(_lib.lib().moe_ep_get_active_ranks(self._live(), mask, _int32(n, "world_size")))
        return [bool(mask[r]) for r in range(n)]

    def set_active_ranks(self, active):
        """Collective over every rank of the group, each passing the same mask:
        `active` is a sequence of world_size truth values (a list of bools, a
        numpy array), active[r] true if rank r stays active.  At least one rank
        stays active and no pair may be in flight on any slot (INVALID_STATE
        otherwise).  From the next dispatch the experts of inactive ranks do not
        exist for the group: their picks are dropped, combine sums over the
        active ranks (not renormalised), an inactive rank's dispatch receives
        nothing and its combine output is zeros; an inactive rank still makes
        every collective call.  mask_epoch
        increments.  A mask whose length is not the handle's world_size, or
        masks that differ between ranks, raise MoeEpError(ERROR_INVALID_ARGUMENT)
        on every rank.  Under failure_policy "mask" it is
        collective over the ranks active before or after it only, at most one
        rank becomes active per call, and that is how survivors admit a
        replacement (rejoin=True) or a rank they dropped (HOST and
        NVLINK_TWO_SIDED)."""
        handle = self._live()
        try:
            values = [1 if v else 0 for v in active]
        except TypeError:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT,
                             f"active: expected a sequence of world_size truth values, got {active!r}") from None
        n = _int32(len(values), "world_size")
        mask = (ctypes.c_uint8 * max(n, 1))(*values)
        self._check_with_bootstrap(_lib.lib().moe_ep_set_active_ranks(handle, mask, n))

    def destroy(self):
        """Collective; idempotent.  Views and arrays made from them must not be
        used afterwards: their memory is released."""
        if self._ptr.value is None:
            return
        outstanding = _dlpack.live_exports_of(self)
        status = _lib.lib().moe_ep_destroy(ctypes.byref(self._ptr))
        self._ptr = _lib.HandlePtr()  # NULL whatever destroy did: it never leaves it usable
        for key in list(self._epochs):
            self._epochs[key] += 1
        self._keep_dispatch, self._keep_combine = {}, {}
        if outstanding:
            warnings.warn(f"moe_ep: handle destroyed while {outstanding} array(s) made from its "
                          "views are still alive; their memory is released", ResourceWarning,
                          stacklevel=2)
        self._check_with_bootstrap(status)

    close = destroy

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()
        return False

    def __del__(self):
        # destroy is collective: running it from the garbage collector, at a
        # moment that differs per rank, could pair it with a peer's dispatch.
        # Leak instead, and say so.
        ptr = getattr(self, "_ptr", None)
        if ptr is not None and ptr.value is not None:
            warnings.warn("moe_ep: MoeEp handle garbage-collected without destroy(); its "
                          "resources are leaked (use `with` or call destroy() on every rank)",
                          ResourceWarning)
