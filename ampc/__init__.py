"""ampc: automatic mixed precision for NumPy arrays and DLPack GPU buffers.

The array layer, dtypes, casts, GradScaler, Parameter and autocast's state and dispatch engine
live in the C extension ampc._C; CUDA kernels in ampc._cuda, loaded the first time a GPU array
is seen.
"""

from ampc import _C
from ampc._C import (
    ArgumentError,
    Array,
    CudaError,
    OutOfMemoryError,
    Parameter,
    StateDictError,
    as_dtype,
    cast,
    from_dlpack,
    get_num_threads,
    set_num_threads,
)
from ampc import amp, autograd, backends, cpu, cuda, distributed, models, nn, optim, random
from ampc.autograd import Tensor, enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from ampc.random import manual_seed
from ampc.amp import (
    AutocastOp,
    GradScaler,
    autocast,
    autocast_decrement_nesting,
    autocast_increment_nesting,
    autocast_op,
    autocast_policy,
    clear_autocast_cache,
    custom_bwd,
    custom_fwd,
    get_autocast_cpu_dtype,
    get_autocast_dtype,
    get_autocast_gpu_dtype,
    is_autocast_cpu_enabled,
    is_autocast_available,
    is_autocast_cache_enabled,
    is_autocast_enabled,
    register_autocast,
    set_autocast_cache_enabled,
    set_autocast_cpu_dtype,
    set_autocast_cpu_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
    set_autocast_gpu_dtype,
)

__version__ = "0.1.0"

# The floating dtypes by name, as _C lists them (kernels/dtypes.def, the one place a dtype is
# declared): ampc.float16 is numpy.dtype("float16"), ampc.bfloat16 numpy.dtype(ml_dtypes.bfloat16);
# those only stored and cast (kind "stored_float": float8) too, as torch names its float8 dtypes.
# Module attributes through __getattr__ (PEP 562), so a dtype added to the table needs no line here.
_FLOATING_DTYPES = {name: dtype for name, kind, *_, dtype in _C._dtypes() if kind in ("float", "stored_float")}


def __getattr__(name):
    try:
        return _FLOATING_DTYPES[name]
    except KeyError:
        raise AttributeError(f"module 'ampc' has no attribute '{name}'") from None


def __dir__():
    return sorted(set(globals()) | set(_FLOATING_DTYPES))


__all__ = [
    "ArgumentError",
    "StateDictError",
    "Array",
    "AutocastOp",
    "CudaError",
    "GradScaler",
    "OutOfMemoryError",
    "Parameter",
    "Tensor",
    "amp",
    "as_dtype",
    "autocast",
    "autocast_decrement_nesting",
    "autocast_increment_nesting",
    "autocast_op",
    "autocast_policy",
    "autograd",
    "backends",
    "cast",
    "clear_autocast_cache",
    "cpu",
    "cuda",
    "custom_bwd",
    "custom_fwd",
    "distributed",
    "enable_grad",
    "from_dlpack",
    "get_autocast_dtype",
    "get_num_threads",
    "is_autocast_available",
    "is_autocast_cache_enabled",
    "is_autocast_enabled",
    "is_grad_enabled",
    "manual_seed",
    "models",
    "nn",
    "no_grad",
    "optim",
    "random",
    "register_autocast",
    "set_autocast_cache_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
    "set_grad_enabled",
    "set_num_threads",
] + list(_FLOATING_DTYPES)
