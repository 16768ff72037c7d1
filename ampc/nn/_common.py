"""What the modules of ampc.nn.functional share: the elementwise op table, the accumulation dtype
of a storage dtype, element counts. Its own module so that functional.py and the modules it
re-exports (_attention, _embedding) import it without importing each other."""

import math

import numpy as np

from ampc import _C

OPS = _C._ew_ops()
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def acc_dtype(dtype):
    """The dtype the kernels accumulate in for data of this dtype."""
    return F64 if dtype == F64 else F32


def numel(x):
    return math.prod(int(s) for s in x.shape)
