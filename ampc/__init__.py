"""ampc: automatic mixed precision for NumPy arrays and DLPack GPU buffers.

The array layer, dtypes, casts, GradScaler, Parameter and autocast's state and dispatch engine
live in the C extension ampc._C; CUDA kernels in ampc._cuda, loaded the first time a GPU array
is seen.
"""

from ampc._C import (
    ArgumentError,
    Array,
    CudaError,
    GradScaler,
    OutOfMemoryError,
    Parameter,
    as_dtype,
    bfloat16,
    cast,
    float16,
    float32,
    float64,
    from_dlpack,
    get_num_threads,
    set_num_threads,
)
from ampc import amp, cpu, cuda, optim
from ampc.amp import (
    AutocastOp,
    autocast,
    autocast_decrement_nesting,
    autocast_increment_nesting,
    autocast_op,
    autocast_policy,
    clear_autocast_cache,
    custom_bwd,
    custom_fwd,
    get_autocast_dtype,
    is_autocast_available,
    is_autocast_cache_enabled,
    is_autocast_enabled,
    register_autocast,
    set_autocast_cache_enabled,
    set_autocast_dtype,
    set_autocast_enabled,
)

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Array",
    "AutocastOp",
    "CudaError",
    "GradScaler",
    "OutOfMemoryError",
    "Parameter",
    "amp",
    "as_dtype",
    "autocast",
    "autocast_decrement_nesting",
    "autocast_increment_nesting",
    "autocast_op",
    "autocast_policy",
    "bfloat16",
    "cast",
    "clear_autocast_cache",
    "cpu",
    "cuda",
    "custom_bwd",
    "custom_fwd",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "get_autocast_dtype",
    "get_num_threads",
    "is_autocast_available",
    "is_autocast_cache_enabled",
    "is_autocast_enabled",
    "optim",
    "register_autocast",
    "set_autocast_cache_enabled",
    "set_autocast_dtype",
    "set_autocast_enabled",
    "set_num_threads",
]
