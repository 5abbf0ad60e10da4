"""ctypes mirror of include/moe_ep_c.h and the loading of libmoe_ep.

Everything here is mechanical: one ctypes Structure per C struct, in the
header's field order (ctypes applies the same alignment rules as the C
compiler, which the layout test checks against a C probe), and one
(name, restype, argtypes) entry per exported function.
"""

import ctypes
import ctypes.util
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char_p, c_int32, c_int64,
                    c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)

# --- status codes (moe_ep_status_t) ------------------------------------------
SUCCESS = 0
ERROR_INVALID_ARGUMENT = 1
ERROR_UNSUPPORTED = 2
ERROR_CUDA = 3
ERROR_BOOTSTRAP = 4
ERROR_OUT_OF_MEMORY = 5
ERROR_TIMEOUT = 6
ERROR_INVALID_STATE = 7
ERROR_INVALID_INPUT = 8
ERROR_INTERNAL = 9

# --- DLPack device types and dtype codes (DLPack 1.1 numbering) ---------------
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3

DTYPE_INT = 0
DTYPE_UINT = 1
DTYPE_FLOAT = 2
DTYPE_BFLOAT = 4
DTYPE_FLOAT8_E4M3FN = 10
DTYPE_FLOAT8_E5M2 = 12
DTYPE_FLOAT4_E2M1FN = 17

BACKEND_AUTO = 0
BACKEND_NVLINK_TWO_SIDED = 1
BACKEND_HOST = 2
BACKEND_NCCL = 3

# Receive layouts (params.receive_layout, MOE_EP_LAYOUT_*) and the scale
# layouts of the expert layouts (params.scale_layout, MOE_EP_SCALES_*).
LAYOUT_RANK_MAJOR = 0
LAYOUT_EXPERT_MAJOR = 1
LAYOUT_EXPERT_PACKED = 2
SCALES_ROW_MAJOR = 0
SCALES_COLUMN_MAJOR = 1

# The low-precision wire (params.dispatch_wire / combine_wire, MOE_EP_WIRE_*;
# params.wire_scale, MOE_EP_WIRE_SCALE_*): docs/semantics.md, "A low-precision wire".
WIRE_AS_IS = 0
WIRE_FP8_E4M3_BLOCK128 = 1
WIRE_SCALE_FP32 = 0
WIRE_SCALE_UE8M0 = 1

# Phases of a call (MOE_EP_PHASE_*), for moe_ep_get_last_path.
PHASE_DISPATCH = 0
PHASE_COMBINE = 1

# config.failure_policy (MOE_EP_ON_FAILURE_*): docs/reliability.md, "Surviving a dead rank".
ON_FAILURE_FAIL_HANDLE = 0
ON_FAILURE_MASK = 1


class Device(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class Tensor(Structure):
    """moe_ep_tensor_t == DLPack's DLTensor."""
    _fields_ = [
        ("data", c_void_p),
        ("device", Device),
        ("ndim", c_int32),
        ("dtype", DType),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("byte_offset", c_uint64),
    ]


# DLPack's managed tensors, as they sit behind a "dltensor" (legacy) or a
# "dltensor_versioned" capsule.  The deleter is kept as a raw pointer so that
# both directions (reading a producer's, writing our own) use one type.
class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", Tensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", c_void_p),
        ("flags", c_uint64),
        ("dl_tensor", Tensor),
    ]


DLPACK_FLAG_READ_ONLY = 1 << 0

ALLGATHER_FN = CFUNCTYPE(c_int32, c_void_p, c_void_p, c_void_p, c_size_t)
BARRIER_FN = CFUNCTYPE(c_int32, c_void_p)


class BootstrapStruct(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rank", c_int32),
        ("world_size", c_int32),
        ("ctx", c_void_p),
        ("allgather", ALLGATHER_FN),
        ("barrier", BARRIER_FN),
    ]


class Params(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_experts", c_int32),
        ("top_k", c_int32),
        ("max_tokens_per_rank", c_int32),
        ("hidden_size", c_int32),
        ("hidden_dtype", DType),
        ("hidden_row_elems", c_int32),
        ("scale_row_elems", c_int32),
        ("scale_dtype", DType),
        ("invalid_expert_id", c_int32),
        ("enable_eplb_stats", c_int32),
        ("combine_dtype", DType),
        ("receive_layout", c_int32),
        ("expert_capacity", c_int32),
        ("expert_alignment", c_int32),
        ("expert_rows", c_int32),
        ("expert_output_weighted", c_int32),
        ("scale_layout", c_int32),
        ("dispatch_wire", c_int32),
        ("combine_wire", c_int32),
        ("wire_scale", c_int32),
        ("dispatch_dequantize", c_int32),
    ]


class Config(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("backend", c_int32),
        ("num_sms", c_int32),
        ("timeout_ms", c_int32),
        ("device", c_int32),
        ("zero_copy_combine", c_int32),
        ("micro_batches", c_int32),
        # docs/reliability.md, "Surviving a dead rank".  The two strings are
        # bytes objects that the Config instance references (ctypes keeps
        # them in its _objects), so they live as long as the struct.
        ("failure_policy", c_int32),
        ("rejoin", c_int32),
        ("store_address", c_char_p),
        ("store_prefix", c_char_p),
    ]


class DispatchArgs(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("hidden_states", POINTER(Tensor)),
        ("topk_ids", POINTER(Tensor)),
        ("topk_weights", POINTER(Tensor)),
        ("hidden_states_scale", POINTER(Tensor)),
        ("runtime_max_tokens_per_rank", c_int32),
        ("eplb_local_stats", POINTER(Tensor)),
    ]


DISPATCH_RESULT_FIELDS = ("hidden_states", "topk_ids", "topk_weights", "hidden_states_scale",
                          "recv_counts", "local_expert_counts", "eplb_gathered_stats",
                          "combine_input")


# The expert layouts' results (absent in the default rank-major layout).
EXPERT_LAYOUT_RESULT_FIELDS = ("expert_counts", "expert_offsets", "row_sources", "row_weights", "dropped_pairs")


class DispatchResult(Structure):
    _fields_ = ([("struct_size", c_uint32), ("tokens_per_rank", c_int32)] +
                [(name, Tensor) for name in DISPATCH_RESULT_FIELDS + EXPERT_LAYOUT_RESULT_FIELDS])


class CombineResult(Structure):
    _fields_ = [("struct_size", c_uint32), ("output", Tensor)]


class Health(Structure):
    """moe_ep_health_t, what moe_ep_poll_health reports."""
    _fields_ = [
        ("struct_size", c_uint32),
        ("status", c_int32),
        ("failed_rank", c_int32),
        ("active_count", c_int32),
        ("mask_epoch", c_uint64),
    ]


HandlePtr = c_void_p  # moe_ep_handle_t: opaque
StorePtr = c_void_p  # moe_ep_store_t: opaque

# (name, restype, argtypes).  Every function returns moe_ep_status_t except the
# three string getters.
_FUNCTIONS = [
    ("moe_ep_status_string", c_char_p, [c_int32]),
    ("moe_ep_last_error", c_char_p, []),
    ("moe_ep_get_version", c_int32, [POINTER(c_int32), POINTER(c_int32), POINTER(c_int32)]),
    ("moe_ep_bootstrap_init", c_int32, [POINTER(BootstrapStruct), c_size_t]),
    ("moe_ep_params_init", c_int32, [POINTER(Params), c_size_t]),
    ("moe_ep_config_init", c_int32, [POINTER(Config), c_size_t]),
    ("moe_ep_dispatch_args_init", c_int32, [POINTER(DispatchArgs), c_size_t]),
    ("moe_ep_dispatch_result_init", c_int32, [POINTER(DispatchResult), c_size_t]),
    ("moe_ep_combine_result_init", c_int32, [POINTER(CombineResult), c_size_t]),
    ("moe_ep_health_init", c_int32, [POINTER(Health), c_size_t]),
    ("moe_ep_is_platform_supported", c_int32, [c_int32, POINTER(c_int32)]),
    ("moe_ep_workspace_size", c_int32, [POINTER(Params), POINTER(Config), c_int32, POINTER(c_uint64)]),
    ("moe_ep_create", c_int32, [POINTER(BootstrapStruct), POINTER(Params), POINTER(Config),
                                POINTER(HandlePtr)]),
    ("moe_ep_dispatch", c_int32, [HandlePtr, POINTER(DispatchArgs), POINTER(DispatchResult), c_void_p]),
    ("moe_ep_combine", c_int32, [HandlePtr, POINTER(Tensor), POINTER(Tensor), POINTER(CombineResult),
                                 c_void_p]),
    ("moe_ep_dispatch_send", c_int32, [HandlePtr, c_int32, POINTER(DispatchArgs), c_void_p]),
    ("moe_ep_dispatch_recv", c_int32, [HandlePtr, c_int32, POINTER(DispatchResult), c_void_p]),
    ("moe_ep_combine_send", c_int32, [HandlePtr, c_int32, POINTER(Tensor), c_void_p]),
    ("moe_ep_combine_recv", c_int32, [HandlePtr, c_int32, POINTER(Tensor), POINTER(CombineResult), c_void_p]),
    ("moe_ep_get_backend", c_int32, [HandlePtr, POINTER(c_int32)]),
    ("moe_ep_get_last_path", c_int32, [HandlePtr, c_int32, POINTER(c_int32)]),
    ("moe_ep_path_name", c_char_p, [c_int32]),
    ("moe_ep_get_async_error", c_int32, [HandlePtr, POINTER(c_int32)]),
    ("moe_ep_poll_health", c_int32, [HandlePtr, POINTER(Health)]),
    ("moe_ep_get_active_ranks", c_int32, [HandlePtr, POINTER(c_uint8), c_int32]),
    ("moe_ep_set_active_ranks", c_int32, [HandlePtr, POINTER(c_uint8), c_int32]),
    ("moe_ep_destroy", c_int32, [POINTER(HandlePtr)]),
    ("moe_ep_store_serve", c_int32, [c_char_p, c_int32, POINTER(StorePtr)]),
    ("moe_ep_store_port", c_int32, [StorePtr, POINTER(c_int32)]),
    ("moe_ep_store_destroy", c_int32, [POINTER(StorePtr)]),
    ("moe_ep_bootstrap_from_store", c_int32, [c_char_p, c_char_p, c_int32, c_int32, c_int32,
                                              POINTER(BootstrapStruct)]),
    ("moe_ep_bootstrap_release", c_int32, [POINTER(BootstrapStruct)]),
]

_MPI_FUNCTIONS = [
    ("moe_ep_mpi_bootstrap_init", c_int32, [c_void_p, POINTER(BootstrapStruct), c_size_t]),
    ("moe_ep_mpi_bootstrap_init_fint", c_int32, [c_int32, POINTER(BootstrapStruct), c_size_t]),
    ("moe_ep_mpi_bootstrap_release", c_int32, [POINTER(BootstrapStruct)]),
]

_lock = threading.Lock()
_lib = None
_mpi_lib = None


def _bind(cdll, table):
    for name, restype, argtypes in table:
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return cdll


# The wheel bundles the libraries here, next to this file.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _load(env_var, soname, dirs=()):
    """Loads `soname` from $env_var if set, else from the first of `dirs`
    that holds it, else from the dynamic loader's search path
    (LD_LIBRARY_PATH, ldconfig cache)."""
    path = os.environ.get(env_var)
    if path:
        # An explicit path that does not load is an error, not a reason to
        # silently pick some other copy of the library.
        return ctypes.CDLL(path), path
    errors = []
    for d in dirs:
        candidate = os.path.join(d, soname)
        if os.path.exists(candidate):
            return ctypes.CDLL(candidate), candidate
    for name in (soname, ctypes.util.find_library(soname.split(".so")[0][3:])):
        if not name:
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            errors.append(str(e))
    raise OSError(f"moe_ep: cannot load {soname}: not found in {', '.join(dirs)} nor by the "
                  f"dynamic loader; install the wheel (pip install bindings/python), set {env_var} "
                  f"to the library's path, or add its directory to LD_LIBRARY_PATH "
                  f"({'; '.join(errors)})")


def lib():
    """The bound libmoe_ep (loaded once): $MOE_EP_LIBRARY, else the one
    bundled in the package (a wheel), else the dynamic loader's path."""
    global _lib
    with _lock:
        if _lib is None:
            cdll, path = _load("MOE_EP_LIBRARY", "libmoe_ep.so.0", [PACKAGE_DIR])
            _lib = _bind(cdll, _FUNCTIONS)
            _lib.loaded_from = path
        return _lib


def mpi_lib():
    """The bound libmoe_ep_mpi (the Open MPI adapter), loaded on first use:
    $MOE_EP_MPI_LIBRARY, else next to the libmoe_ep that was loaded (so that
    the pair always matches), else the one bundled in the package, else the
    dynamic loader's path."""
    global _mpi_lib
    core = lib()
    with _lock:
        if _mpi_lib is None:
            dirs = []
            if os.path.sep in core.loaded_from:
                dirs.append(os.path.dirname(os.path.abspath(core.loaded_from)))
            dirs.append(PACKAGE_DIR)
            cdll, path = _load("MOE_EP_MPI_LIBRARY", "libmoe_ep_mpi.so.0", dirs)
            _mpi_lib = _bind(cdll, _MPI_FUNCTIONS)
            _mpi_lib.loaded_from = path
        return _mpi_lib
