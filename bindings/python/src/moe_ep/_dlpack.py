"""DLPack in both directions, with ctypes only.

In:  any object with __dlpack__ (torch, cupy, jax, numpy, our own views) is
     turned into a pointer to its DLTensor.  We *borrow* the capsule: it is
     not renamed to "used_dltensor", so the producer's capsule destructor
     still owns the tensor, and keeping the capsule (plus the producer object)
     referenced keeps the memory alive for as long as the library may read it.

Out: a view of library-owned memory becomes a capsule that numpy.from_dlpack
     or torch.from_dlpack consume.  The managed-tensor struct, its shape array
     and a reference to the view (hence to the handle) live in a registry
     until the consumer calls the deleter, or until the capsule dies
     unconsumed.
"""

import ctypes
import itertools
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
# Separate function objects (indexing makes a new one) so that the argtypes
# of the py_object flavour and of the raw-pointer flavour used inside the
# capsule destructor (where the capsule's refcount is already 0 and must not
# be touched through a py_object) do not clash.
_IsValid = _api["PyCapsule_IsValid"]
_IsValid.restype = c_int
_IsValid.argtypes = [py_object, c_char_p]
_GetPointer = _api["PyCapsule_GetPointer"]
_GetPointer.restype = c_void_p
_GetPointer.argtypes = [py_object, c_char_p]
_IsValidRaw = _api["PyCapsule_IsValid"]
_IsValidRaw.restype = c_int
_IsValidRaw.argtypes = [c_void_p, c_char_p]
_GetPointerRaw = _api["PyCapsule_GetPointer"]
_GetPointerRaw.restype = c_void_p
_GetPointerRaw.argtypes = [c_void_p, c_char_p]
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


def borrow(obj, stream=0, name="tensor"):
    """Pointer to obj's DLTensor.  `stream` is the cudaStream_t (int) the
    library will run on; it is handed to the producer for CUDA tensors."""
    from ._views import View  # local import: _views imports this module

    if isinstance(obj, View):
        return obj._borrow()
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"moe_ep: {name} must support the DLPack protocol (__dlpack__), "
                        f"got {type(obj).__name__}")
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


# --- export --------------------------------------------------------------------

_registry = {}
_registry_lock = threading.Lock()
_keys = itertools.count(1)

_DELETER_T = ctypes.CFUNCTYPE(None, c_void_p)
_DESTRUCTOR_T = ctypes.CFUNCTYPE(None, c_void_p)


def _release(key):
    with _registry_lock:
        _registry.pop(key, None)


@_DELETER_T
def _delete_legacy(managed_ptr):
    # Called by the consumer (or by our capsule destructor) exactly once.
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


@_DESTRUCTOR_T
def _capsule_destructor(capsule_ptr):
    # A capsule that still has its original name was never consumed: free the
    # tensor ourselves.  A consumed one was renamed to "used_..." and its
    # consumer owns the deleter call.
    try:
        if _IsValidRaw(capsule_ptr, _NAME_VERSIONED):
            _delete_versioned(_GetPointerRaw(capsule_ptr, _NAME_VERSIONED))
        elif _IsValidRaw(capsule_ptr, _NAME_LEGACY):
            _delete_legacy(_GetPointerRaw(capsule_ptr, _NAME_LEGACY))
    except Exception:
        pass


_DELETER_LEGACY_ADDR = ctypes.cast(_delete_legacy, c_void_p).value
_DELETER_VERSIONED_ADDR = ctypes.cast(_delete_versioned, c_void_p).value
_DESTRUCTOR_ADDR = ctypes.cast(_capsule_destructor, c_void_p).value

# Zero-element views may have data == NULL; some consumers refuse a NULL data
# pointer even for an empty array, so they get this never-dereferenced byte.
_EMPTY = ctypes.create_string_buffer(1)


def export(owner, data, device, dtype, shape, versioned):
    """A new DLPack capsule for `shape` elements of `dtype` at `data` (int).
    `owner` is kept alive until the consumer is done with the tensor."""
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
        name = _NAME_VERSIONED_BUF
    else:
        managed = _lib.DLManagedTensor()
        managed.manager_ctx = key
        managed.deleter = _DELETER_LEGACY_ADDR
        tensor = managed.dl_tensor
        name = _NAME_LEGACY_BUF
    tensor.data = data
    tensor.device.device_type, tensor.device.device_id = device
    tensor.ndim = len(shape)
    tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes = dtype
    tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(c_int64))
    tensor.strides = None  # compact row-major
    tensor.byte_offset = 0
    with _registry_lock:
        _registry[key] = (managed, shape_arr, owner)
    return _New(ctypes.addressof(managed), ctypes.addressof(name), _DESTRUCTOR_ADDR)


def live_exports():
    """Number of exported tensors whose consumer has not released them yet."""
    with _registry_lock:
        return len(_registry)


def live_exports_of(owner_handle):
    with _registry_lock:
        return sum(1 for (_, _, v) in _registry.values() if getattr(v, "_handle", None) is owner_handle)
