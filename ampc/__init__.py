"""ampc: automatic mixed precision for NumPy arrays and DLPack GPU buffers.

The array layer, dtypes and casts live in the C extension ampc._C; CUDA kernels
in ampc._cuda, loaded the first time a GPU array is seen.
"""

from ampc._C import (
    ArgumentError,
    Array,
    CudaError,
    GradScaler,
    OutOfMemoryError,
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
from ampc import amp, cuda, optim

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "Array",
    "CudaError",
    "GradScaler",
    "OutOfMemoryError",
    "as_dtype",
    "bfloat16",
    "amp",
    "cast",
    "cuda",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "get_num_threads",
    "optim",
    "set_num_threads",
]
