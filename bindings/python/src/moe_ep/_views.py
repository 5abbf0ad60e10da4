"""DLPack-capable views of library-owned result memory."""

import ctypes
from ctypes import c_int64

from . import _dlpack, _lib
from ._errors import MoeEpError

_DTYPE_NAMES = {
    (_lib.DTYPE_BFLOAT, 16): "bfloat16",
    (_lib.DTYPE_FLOAT, 16): "float16",
    (_lib.DTYPE_FLOAT, 32): "float32",
    (_lib.DTYPE_FLOAT, 64): "float64",
    (_lib.DTYPE_FLOAT8_E4M3FN, 8): "float8_e4m3fn",
    (_lib.DTYPE_FLOAT8_E5M2, 8): "float8_e5m2",
    (_lib.DTYPE_FLOAT4_E2M1FN, 4): "float4_e2m1fn",
}


# Names view_as accepts: the named dtypes and every integer width.
_DTYPE_BY_NAME = {name: key for key, name in _DTYPE_NAMES.items() if key[1] >= 8}
for _bits in (8, 16, 32, 64):
    _DTYPE_BY_NAME[f"int{_bits}"] = (_lib.DTYPE_INT, _bits)
    _DTYPE_BY_NAME[f"uint{_bits}"] = (_lib.DTYPE_UINT, _bits)


def dtype_name(code, bits):
    if (code, bits) in _DTYPE_NAMES:
        return _DTYPE_NAMES[(code, bits)]
    if code == _lib.DTYPE_INT:
        return f"int{bits}"
    if code == _lib.DTYPE_UINT:
        return f"uint{bits}"
    return f"dtype(code={code},bits={bits})"


class View:
    """A result tensor in library-owned memory (host memory for the HOST
    backend, device memory for NVLINK_TWO_SIDED).

    Consume it with any DLPack consumer: numpy.from_dlpack(view),
    torch.from_dlpack(view), cupy.from_dlpack(view).  The consumer's array
    aliases the library's memory (no copy) and keeps the handle object alive,
    but its contents follow the library's rules: dispatch results are valid
    until the matching combine (or combine_send of their slot) is issued, a
    library-owned combine output until the next combine (or combine_recv of
    its slot), and nothing after destroy().  Exporting a view outside
    its validity raises MoeEpError(INVALID_STATE).  CUDA views are ready on the
    stream passed to the call that produced them.
    """

    __slots__ = ("_handle", "_epoch_name", "_epoch", "data_ptr", "device", "dtype_tuple", "shape",
                 "_tensor", "_shape_arr", "__weakref__")

    def __init__(self, handle, epoch_name, tensor):
        self._handle = handle
        self._epoch_name = epoch_name
        self._epoch = handle._epochs[epoch_name]
        self.data_ptr = tensor.data or 0
        self.device = (tensor.device.device_type, tensor.device.device_id)
        self.dtype_tuple = (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
        # Copy the shape: the handle's shape arrays are rewritten by later calls.
        self.shape = tuple(int(tensor.shape[i]) for i in range(tensor.ndim))
        self._tensor = None
        self._shape_arr = None

    @property
    def dtype(self):
        return dtype_name(self.dtype_tuple[0], self.dtype_tuple[1])

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def valid(self):
        """Whether the library still guarantees this memory's contents."""
        h = self._handle
        return h._ptr.value is not None and h._epochs[self._epoch_name] == self._epoch

    def _check_valid(self):
        if not self.valid:
            if self._handle._ptr.value is None:
                why = "its handle was destroyed"
            elif self._epoch_name[0] == "dispatch":
                why = f"the combine (or combine_send) of its slot {self._epoch_name[1]} was issued"
            else:
                why = (f"a later combine (or combine_recv) of its slot {self._epoch_name[1]} reused the "
                       "library-owned output")
            raise MoeEpError(_lib.ERROR_INVALID_STATE, f"this {self.dtype}{list(self.shape)} result view "
                             f"is no longer valid: {why}")

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self._check_valid()
        if copy:
            raise BufferError("moe_ep: views alias library memory; copy=True is not supported "
                              "(copy the consumer's array instead)")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError(f"moe_ep: view lives on device {self.device}, asked for {tuple(dl_device)}")
        versioned = max_version is not None and max_version[0] >= 1
        return _dlpack.export(self, self.data_ptr, self.device, self.dtype_tuple, self.shape, versioned)

    def view_as(self, dtype):
        """The same memory as another dtype of the same element width (a new
        View, valid as long as this one): e.g. view_as("uint16") on a bfloat16
        view.  numpy has no bfloat16 or float8 and refuses such views in
        np.from_dlpack (numpy's BufferError); it reads their raw bits this
        way, and ml_dtypes gives the values:
        np.from_dlpack(v.view_as("uint16")).view(ml_dtypes.bfloat16)."""
        target = _DTYPE_BY_NAME.get(str(dtype))
        if target is None:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.view_as: dtype {dtype!r} is not one of "
                             f"{sorted(_DTYPE_BY_NAME)}")
        if target[1] != self.dtype_tuple[1] or self.dtype_tuple[2] != 1:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.view_as: expected a dtype of "
                             f"{self.dtype_tuple[1]} bits like this {self.dtype} view, got {dtype} "
                             f"({target[1]} bits)")
        self._check_valid()
        v = View.__new__(View)
        v._handle, v._epoch_name, v._epoch = self._handle, self._epoch_name, self._epoch
        v.data_ptr, v.device, v.shape = self.data_ptr, self.device, self.shape
        v.dtype_tuple = (target[0], target[1], 1)
        v._tensor = v._shape_arr = None
        return v

    def numpy(self):
        """This host view as a numpy array aliasing it (np.from_dlpack), with
        the dtypes numpy lacks as ml_dtypes' types (bfloat16, float8_e4m3fn,
        float8_e5m2).  Without ml_dtypes those are refused with a message
        naming view_as, which gives their raw bits."""
        import numpy as np
        self._check_valid()
        if self.device[0] not in (_lib.DEVICE_CPU, _lib.DEVICE_CUDA_HOST):
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.numpy: the view lives on device {self.device}; "
                             "read it through torch.from_dlpack(view) or cupy.from_dlpack(view)")
        code, bits, _ = self.dtype_tuple
        if code in (_lib.DTYPE_INT, _lib.DTYPE_UINT) or (code == _lib.DTYPE_FLOAT and bits in (16, 32, 64)):
            return np.from_dlpack(self)
        if self.dtype not in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.numpy: numpy cannot hold {self.dtype}; "
                             f"read its bytes with view_as('uint8') where the width allows")
        try:
            import ml_dtypes
        except ImportError:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.numpy: numpy has no {self.dtype}; install "
                             f"ml_dtypes for its values, or read the raw bits with "
                             f"np.from_dlpack(view.view_as('uint{bits}'))") from None
        return np.from_dlpack(self.view_as(f"uint{bits}")).view(getattr(ml_dtypes, self.dtype))

    def write(self, array):
        """Copies `array` (any object numpy can read, with this view's shape
        and element width) into a host view: for DispatchResult.combine_input
        with numpy, whose from_dlpack arrays may be read-only (numpy < 2.1).
        CUDA views: write through torch.from_dlpack(view) or cupy instead."""
        import numpy as np
        self._check_valid()
        if self.device[0] not in (_lib.DEVICE_CPU, _lib.DEVICE_CUDA_HOST):
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.write: the view lives on device {self.device}; "
                             "write through torch.from_dlpack(view) or cupy.from_dlpack(view)")
        a = np.ascontiguousarray(array)
        if tuple(a.shape) != self.shape or a.itemsize * 8 != self.dtype_tuple[1]:
            raise MoeEpError(_lib.ERROR_INVALID_ARGUMENT, f"View.write: expected {list(self.shape)} elements of "
                             f"{self.dtype_tuple[1]} bits, got {list(a.shape)} of {a.itemsize * 8} bits")
        if a.nbytes:
            ctypes.memmove(self.data_ptr, a.ctypes.data, a.nbytes)

    def _borrow(self):
        """This view as a DLTensor pointer (to pass it back into the library,
        e.g. dispatch output straight into combine)."""
        self._check_valid()
        if self._tensor is None:
            self._shape_arr = (c_int64 * max(self.ndim, 1))(*self.shape)
            t = _lib.Tensor()
            t.data = self.data_ptr or None
            t.device.device_type, t.device.device_id = self.device
            t.ndim = self.ndim
            t.dtype.code, t.dtype.bits, t.dtype.lanes = self.dtype_tuple
            t.shape = ctypes.cast(self._shape_arr, ctypes.POINTER(c_int64))
            self._tensor = t
        return _dlpack.Borrowed(ctypes.pointer(self._tensor), (self,))

    def __repr__(self):
        state = "" if self.valid else ", expired"
        return f"moe_ep.View({self.dtype}{list(self.shape)}, device={self.device}{state})"


class DispatchResult:
    """What moe_ep_dispatch returned.  Every field is a View or None (absent:
    no weights given, no scales, eplb stats off).  P = world_size *
    tokens_per_rank receive rows, rank-major (see moe_ep_c.h).  In an expert
    layout, expert_counts, expert_offsets (expert_packed), row_sources,
    row_weights and dropped_pairs are Views too, topk_ids and topk_weights
    None; in rank_major those five are None.  All expire together, when the
    slot's combine (or combine_send) is issued."""

    FIELDS = _lib.DISPATCH_RESULT_FIELDS + _lib.EXPERT_LAYOUT_RESULT_FIELDS

    def __init__(self, handle, raw, slot=0):
        self.tokens_per_rank = int(raw.tokens_per_rank)
        for name in self.FIELDS:
            t = getattr(raw, name)
            setattr(self, name, View(handle, ("dispatch", slot), t) if t.data and t.ndim > 0 else None)

    def __repr__(self):
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"moe_ep.DispatchResult(tokens_per_rank={self.tokens_per_rank}, {fields})"
