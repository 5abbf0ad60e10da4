"""DLPack in both directions, with ctypes only.

In:  any object with __dlpack__ (torch, cupy, jax, numpy, our own views) is
     turned into a pointer to its DLTensor.  We *borrow* the capsule: it is
     not renamed to "used_dltensor", so the producer's capsule destructor
     still owns the tensor, and keeping the capsule (plus the producer object)
     referenced keeps the memory alive for as long as the library may read it.

Out: a view of library-owned memory becomes a capsule that numpy.from_dlpack
     or torch.from_dlpack consume.  The managed-tensor struct, its shape array
     and a reference to the view (hence to the handle) live in a registry
     until the consumer calls the deleter, or until the capsule is found
     unconsumed and unreferenced (see "export" below).
"""

import ctypes
import itertools
import sys
import threading
from ctypes import c_char_p, c_int, c_int64, c_void_p, py_object

from . import _lib

_NAME_LEGACY = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"

# PyCapsule_New keeps the name pointer, not a copy: these buffers are
# module-global so that they outlive every capsule we make.
_NAME_LEGACY_BUF = ctypes.create_string_buffer(_NAME_LEGACY)
_NAME_VERSIONED_BUF = ctypes.create_string_buffer(_NAME_VERSIONED)

_api = ctypes.pythonapi
_IsValid = _api["PyCapsule_IsValid"]
_IsValid.restype = c_int
_IsValid.argtypes = [py_object, c_char_p]
_GetPointer = _api["PyCapsule_GetPointer"]
_GetPointer.restype = c_void_p
_GetPointer.argtypes = [py_object, c_char_p]
_New = _api["PyCapsule_New"]
_New.restype = py_object
_New.argtypes = [c_void_p, c_void_p, c_void_p]

_VERSIONED_DL_TENSOR_OFFSET = _lib.DLManagedTensorVersioned.dl_tensor.offset


class Borrowed:
    """A DLTensor pointer borrowed from a producer, with what keeps it alive."""

    __slots__ = ("ptr", "tensor", "_keepalive", "readonly")

    def __init__(self, ptr, keepalive, readonly=False):
        self.ptr = ptr  # POINTER(_lib.Tensor)
        self.tensor = ptr.contents
        self._keepalive = keepalive
        self.readonly = readonly

    def shape(self):
        return tuple(self.tensor.shape[i] for i in range(self.tensor.ndim))


def dlpack_stream_for(device_type, stream):
    """The `stream` argument for a producer's __dlpack__: the stream the library
    will use, so that the producer orders its pending writes before it.  DLPack
    spells the legacy default stream 1 (0 is ambiguous and disallowed)."""
    if device_type not in (_lib.DEVICE_CUDA,):
        return None
    return stream if stream else 1


# ml_dtypes' numpy types that have a DLPack code of their own: numpy cannot
# export them, so they travel as same-width unsigned integers re-labelled.
# (ml_dtypes.float4_e2m1fn stores one value per byte, not moe_ep's packed
# two per byte, so it is not among them.)
_ML_DTYPES = {
    "bfloat16": (_lib.DTYPE_BFLOAT, 16, 1),
    "float8_e4m3fn": (_lib.DTYPE_FLOAT8_E4M3FN, 8, 1),
    "float8_e5m2": (_lib.DTYPE_FLOAT8_E5M2, 8, 1),
}

# Dtypes that numpy (or another producer) may lack: an integer tensor of the
# same width is accepted in their place as their raw bits.
_OPAQUE_TARGETS = {(_lib.DTYPE_BFLOAT, 16), (_lib.DTYPE_FLOAT, 16), (_lib.DTYPE_FLOAT8_E4M3FN, 8),
                   (_lib.DTYPE_FLOAT8_E5M2, 8)}

_TYPESTR_CODES = {"f": _lib.DTYPE_FLOAT, "i": _lib.DTYPE_INT, "u": _lib.DTYPE_UINT}


def _ml_dtype_of(obj):
    """(code, bits, lanes) if obj is a numpy array of an ml_dtypes type we
    know, else None."""
    dtype = getattr(obj, "dtype", None)
    scalar = getattr(dtype, "type", None)
    if scalar is None or not getattr(scalar, "__module__", "").startswith("ml_dtypes"):
        return None
    if dtype.name not in _ML_DTYPES:
        raise TypeError(f"moe_ep: numpy dtype {dtype.name} (ml_dtypes) has no moe_ep equivalent; "
                        f"use one of {sorted(_ML_DTYPES)}")
    return _ML_DTYPES[dtype.name]


def _retyped(b, dtype):
    """The same tensor labelled with another (code, bits, lanes)."""
    t = _lib.Tensor.from_buffer_copy(b.tensor)
    t.dtype.code, t.dtype.bits, t.dtype.lanes = dtype
    return Borrowed(ctypes.pointer(t), (b, t), b.readonly)


def _from_array_interface(obj, name):
    """A CPU DLTensor built from numpy's __array_interface__, for arrays that
    __dlpack__ refuses to export (read-only arrays before numpy 2.1, which
    cannot signal read-only).  Marked read-only: only inputs come here."""
    ai = obj.__array_interface__
    typestr = ai["typestr"]
    byteorder, kind, size = typestr[0], typestr[1], int(typestr[2:])
    if kind not in _TYPESTR_CODES or byteorder not in "<|=":
        raise TypeError(f"moe_ep: {name}: numpy type {typestr!r} is not supported "
                        "(expected a little-endian float, int or uint array)")
    shape = tuple(int(n) for n in ai["shape"])
    shape_arr = (c_int64 * max(len(shape), 1))(*shape)
    strides_arr = None
    if ai.get("strides") is not None:
        if any(st % size for st in ai["strides"]):
            raise BufferError(f"moe_ep: {name}: strides {ai['strides']} are not whole elements")
        strides_arr = (c_int64 * max(len(shape), 1))(*(st // size for st in ai["strides"]))
    t = _lib.Tensor()
    t.data = ai["data"][0]
    t.device.device_type, t.device.device_id = _lib.DEVICE_CPU, 0
    t.ndim = len(shape)
    t.dtype.code, t.dtype.bits, t.dtype.lanes = _TYPESTR_CODES[kind], size * 8, 1
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(c_int64)) if strides_arr is not None else None
    t.byte_offset = 0
    return Borrowed(ctypes.pointer(t), (obj, shape_arr, strides_arr, t), readonly=True)


def _borrow_dlpack(obj, stream, name):
    device_type = None
    if hasattr(obj, "__dlpack_device__"):
        device_type = int(obj.__dlpack_device__()[0])
    kwargs = {}
    s = dlpack_stream_for(device_type, stream)
    if s is not None:
        kwargs["stream"] = s
    try:
        # Ask for a versioned capsule first (it carries the read-only flag);
        # producers from before DLPack 1.0 (numpy < 2.1) reject the keyword.
        capsule = obj.__dlpack__(max_version=(1, 1), **kwargs)
    except TypeError:
        capsule = obj.__dlpack__(**kwargs)
    if _IsValid(capsule, _NAME_VERSIONED):
        managed = _lib.DLManagedTensorVersioned.from_address(_GetPointer(capsule, _NAME_VERSIONED))
        if managed.version.major != 1:
            raise BufferError(f"moe_ep: {name}: DLPack major version {managed.version.major} "
                              f"is not supported (expected 1)")
        ptr = ctypes.pointer(managed.dl_tensor)
        readonly = bool(managed.flags & _lib.DLPACK_FLAG_READ_ONLY)
        return Borrowed(ptr, (obj, capsule, managed), readonly)
    if _IsValid(capsule, _NAME_LEGACY):
        managed = _lib.DLManagedTensor.from_address(_GetPointer(capsule, _NAME_LEGACY))
        return Borrowed(ctypes.pointer(managed.dl_tensor), (obj, capsule, managed))
    raise BufferError(f"moe_ep: {name}.__dlpack__() returned {type(capsule).__name__}, "
                      f"not a 'dltensor' or 'dltensor_versioned' capsule (already consumed?)")


def borrow(obj, stream=0, name="tensor", expect=None):
    """Pointer to obj's DLTensor.  `stream` is the cudaStream_t (int) the
    library will run on; it is handed to the producer for CUDA tensors.

    `expect` is the (code, bits, lanes) the library wants for this argument,
    or None.  Where it is a type numpy lacks (bf16, fp16, fp8), an integer
    tensor of the same width is passed as its raw bits.  numpy arrays of
    ml_dtypes' bfloat16 / float8 types are accepted as what they are.
    Read-only numpy arrays that cannot be exported through DLPack (numpy <
    2.1) are read through __array_interface__: inputs are only read."""
    from ._views import View  # local import: _views imports this module

    if isinstance(obj, View):
        return obj._borrow()
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"moe_ep: {name} must support the DLPack protocol (__dlpack__), "
                        f"got {type(obj).__name__}")
    ml_dtype = _ml_dtype_of(obj)
    if ml_dtype is not None:
        obj = obj.view(f"uint{ml_dtype[1]}")
    try:
        b = _borrow_dlpack(obj, stream, name)
    except BufferError:
        writeable = getattr(getattr(obj, "flags", None), "writeable", True)
        if writeable or not hasattr(obj, "__array_interface__"):
            raise
        b = _from_array_interface(obj, name)
    if ml_dtype is not None:
        return _retyped(b, ml_dtype)
    got = b.tensor.dtype
    if (expect is not None and (expect[0], expect[1]) in _OPAQUE_TARGETS and got.lanes == 1 and
            got.code in (_lib.DTYPE_INT, _lib.DTYPE_UINT) and got.bits == expect[1]):
        return _retyped(b, expect)
    return b


# --- export --------------------------------------------------------------------
#
# Why the capsules have no destructor: a consumer that refuses a capsule (numpy
# has no bfloat16 or float8) drops it while its own exception is set.  A
# capsule destructor written in Python runs at that moment, and a ctypes
# callback cannot leave an exception pending: numpy's BufferError was lost and
# np.from_dlpack raised "SystemError: returned NULL without setting an
# exception", and the unconsumed tensor stayed registered as live.  Instead the
# registry keeps a reference to each capsule until a consumer takes it
# (renames it to "used_..."), and a capsule that only the registry still
# references was never consumed and is released by _sweep(), outside any
# consumer's error path.

_registry = {}  # key -> [managed, shape_arr, owner, capsule or None, capsule name]
_registry_lock = threading.RLock()
_keys = itertools.count(1)

_DELETER_T = ctypes.CFUNCTYPE(None, c_void_p)


def _release(key):
    with _registry_lock:
        _registry.pop(key, None)


@_DELETER_T
def _delete_legacy(managed_ptr):
    # Called by the consumer exactly once, when it is done with the tensor.
    try:
        _release(_lib.DLManagedTensor.from_address(managed_ptr).manager_ctx)
    except Exception:  # never let an exception escape into C
        pass


@_DELETER_T
def _delete_versioned(managed_ptr):
    try:
        _release(_lib.DLManagedTensorVersioned.from_address(managed_ptr).manager_ctx)
    except Exception:
        pass


_DELETER_LEGACY_ADDR = ctypes.cast(_delete_legacy, c_void_p).value
_DELETER_VERSIONED_ADDR = ctypes.cast(_delete_versioned, c_void_p).value

# sys.getrefcount of a capsule that only the registry references (the
# registry's reference, the local name and the call's argument).
_ONLY_REGISTRY = 3


def _sweep():
    """Forgets capsules a consumer took (it now owns the deleter call) and
    releases the ones that nobody took and nobody references any more."""
    with _registry_lock:
        for key in list(_registry):
            entry = _registry[key]
            capsule = entry[3]
            if capsule is None:
                continue
            if not _IsValid(capsule, entry[4]):
                entry[3] = None  # consumed: renamed by its consumer
            elif sys.getrefcount(capsule) <= _ONLY_REGISTRY:
                del _registry[key]  # never consumed, and unreachable
            del capsule


# Zero-element views may have data == NULL; some consumers refuse a NULL data
# pointer even for an empty array, so they get this never-dereferenced byte.
_EMPTY = ctypes.create_string_buffer(1)


def export(owner, data, device, dtype, shape, versioned):
    """A new DLPack capsule for `shape` elements of `dtype` at `data` (int).
    `owner` is kept alive until the consumer is done with the tensor."""
    _sweep()
    shape_arr = (c_int64 * max(len(shape), 1))(*shape)
    if data is None or data == 0:
        data = ctypes.addressof(_EMPTY)
    key = next(_keys)
    if versioned:
        managed = _lib.DLManagedTensorVersioned()
        managed.version.major, managed.version.minor = 1, 0
        managed.manager_ctx = key
        managed.deleter = _DELETER_VERSIONED_ADDR
        managed.flags = 0  # writable: the caller may e.g. compute in place
        tensor = managed.dl_tensor
        name, name_buf = _NAME_VERSIONED, _NAME_VERSIONED_BUF
    else:
        managed = _lib.DLManagedTensor()
        managed.manager_ctx = key
        managed.deleter = _DELETER_LEGACY_ADDR
        tensor = managed.dl_tensor
        name, name_buf = _NAME_LEGACY, _NAME_LEGACY_BUF
    tensor.data = data
    tensor.device.device_type, tensor.device.device_id = device
    tensor.ndim = len(shape)
    tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = dtype
    tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(c_int64))
    tensor.strides = None  # compact row-major
    tensor.byte_offset = 0
    capsule = _New(ctypes.addressof(managed), ctypes.addressof(name_buf), None)
    with _registry_lock:
        _registry[key] = [managed, shape_arr, owner, capsule, name]
    return capsule


def live_exports():
    """Number of exported tensors that a consumer still holds, or that are
    still referenced without having been consumed."""
    _sweep()
    with _registry_lock:
        return len(_registry)


def live_exports_of(owner_handle):
    _sweep()
    with _registry_lock:
        return sum(1 for entry in _registry.values() if getattr(entry[2], "_handle", None) is owner_handle)
