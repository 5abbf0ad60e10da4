"""Python bindings for libmoe_ep (MoE expert-parallel dispatch/combine).

Pure ctypes over the stable C ABI (include/moe_ep_c.h): no compiled extension.
The library is found through $MOE_EP_LIBRARY (a path) or the dynamic loader
(libmoe_ep.so.0 on LD_LIBRARY_PATH or in the ldconfig cache); the Open MPI
adapter through $MOE_EP_MPI_LIBRARY, next to libmoe_ep, or the loader.

Tensors go in as any object with __dlpack__ (numpy, torch, cupy, jax) and
results come back as DLPack-capable Views of library memory.
"""

from ._errors import MoeEpError, status_string
from ._lib import (BACKEND_AUTO, BACKEND_HOST, BACKEND_NCCL, BACKEND_NVLINK_TWO_SIDED, DEVICE_CPU, DEVICE_CUDA,
                   DEVICE_CUDA_HOST, ERROR_BOOTSTRAP, ERROR_CUDA, ERROR_INTERNAL,
                   ERROR_INVALID_ARGUMENT, ERROR_INVALID_INPUT, ERROR_INVALID_STATE,
                   ERROR_OUT_OF_MEMORY, ERROR_TIMEOUT, ERROR_UNSUPPORTED, LAYOUT_EXPERT_MAJOR,
                   LAYOUT_EXPERT_PACKED, LAYOUT_RANK_MAJOR, ON_FAILURE_FAIL_HANDLE, ON_FAILURE_MASK,
                   SCALES_COLUMN_MAJOR, SCALES_ROW_MAJOR, SUCCESS,
                   WIRE_AS_IS, WIRE_FP8_E4M3_BLOCK128, WIRE_SCALE_FP32, WIRE_SCALE_UE8M0)
from ._views import DispatchResult, View
from .bootstrap import (Bootstrap, CallbackBootstrap, MpiBootstrap, RejoinBootstrap, SingleRankBootstrap,
                        StoreBootstrap, from_mpi4py, from_store, from_torch_distributed)
from .core import Health, MoeEp, dtype_tuple, get_version, is_platform_supported, workspace_size
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "MoeEp", "MoeEpError", "Health", "View", "DispatchResult", "Bootstrap", "CallbackBootstrap",
    "SingleRankBootstrap", "MpiBootstrap", "from_mpi4py", "from_torch_distributed", "get_version",
    "is_platform_supported", "workspace_size", "status_string", "dtype_tuple", "Store", "StoreBootstrap",
    "from_store", "RejoinBootstrap",
]
