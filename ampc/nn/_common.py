"""What the modules of ampc.nn.functional share: the elementwise op table and its call by name, the
accumulation dtype of a storage dtype, element counts. Its own module so that the modules of the ops
(_bare_ops, _attention, _embedding, ...) and _differentiable import it without importing each
other."""

import functools
import math
import numbers

import numpy as np

from ampc import _C
from ampc._C import as_dtype
from ampc._arguments import not_an_array

OPS = _C._ew_ops()
PUBLISHED_IN = "ampc.nn.functional"  # the module that publishes the ops: their __module__ names it
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def acc_dtype(dtype):
    """The dtype the kernels accumulate in for data of this dtype."""
    return F64 if dtype == F64 else F32


def ew(op, a, b=None, c=None, *, param=1.0, scale=1.0, dtype=None, name=None, names=None, param2=0.0):
    """The elementwise kernel op on a, b, c (param and param2: its formula's p and q, ew_ops.def). Its
    errors name the public op `name` (default: op) and its arguments `names` (default: input, other,
    scale)."""
    if param == 1.0 and scale == 1.0 and dtype is None and names is None and param2 == 0.0:  # the C defaults
        return _C._ew(OPS[op], a, b, c, name or op)  # positional: a keyword costs 0.1-0.5 µs a call
    return _C._ew(OPS[op], a, b, c, param=param, scale=scale, dtype=dtype, name=name or op, names=names,
                  param2=param2)


def dtype_of(x):
    """The NumPy dtype of an array of any library (ml_dtypes.bfloat16 for bfloat16)."""
    if isinstance(x, (float, int)):
        return F64
    return as_dtype(x.dtype)


# The dtypes ampc computes on (kernels/dtypes.def's kind "float"), and their names for messages.
FLOATING = {dtype for _, kind, *_, dtype in _C._dtypes() if kind == "float"}
_NAMES = [name for name, kind, *_ in _C._dtypes() if kind == "float"]
FLOATING_NAMES = ", ".join(_NAMES[:-1]) + " or " + _NAMES[-1]  # "float32, float16, bfloat16 or float64"


def is_floating_array(x):
    """Whether x is an array of one of FLOATING's dtypes (bfloat16 too, which NumPy does not count as
    np.floating); False for integer and bool arrays, dtypes ampc does not know, and non-arrays."""
    try:
        return as_dtype(x.dtype) in FLOATING
    except (AttributeError, TypeError, ValueError):
        return False


_BOOL_AND_INTEGER_KINDS = frozenset("biu")


def result_type(op, dtypes):
    """torch's promotion of arrays' dtypes (arrays with dimensions; numbers take no part): a
    floating dtype wins over integers and bool whatever their width (NumPy makes float32 with int32
    float64, torch float32); among floating dtypes equal stays, float64 wins and any other mix is
    float32 (float16 with bfloat16 included); among integers and bool, the smallest type holding
    them all, as NumPy's (torch has none for int64 with uint64: a TypeError). Other dtypes
    (complex, strings), which no op of ampc computes on, promote as NumPy promotes them."""
    dtypes = [np.dtype(d) for d in dtypes]
    if not all(d in FLOATING or d.kind in _BOOL_AND_INTEGER_KINDS for d in dtypes):
        return functools.reduce(np.promote_types, dtypes)
    floating = [d for d in dtypes if d in FLOATING]
    if floating:
        first = floating[0]
        if all(d == first for d in floating):
            return first
        return F64 if F64 in floating else F32
    promoted = functools.reduce(np.promote_types, dtypes)
    if promoted.kind not in _BOOL_AND_INTEGER_KINDS:
        raise TypeError(f"{op}: no integer type holds {' and '.join(sorted({str(d) for d in dtypes}))}")
    return promoted


def floating_dtype(op, name, x):
    """x's dtype when it is floating (ml_dtypes.bfloat16 for bfloat16), else the C ops' TypeError
    naming op and argument: for the ops that take a dtype from an argument before the C code
    reads it (a backward's output dtype, a loss's promotion)."""
    try:
        dtype = as_dtype(x.dtype)
    except TypeError:  # a dtype ampc does not know (complex)
        dtype = None
    if dtype not in FLOATING:
        raise TypeError(f"{op}: {name} must be a floating array ({FLOATING_NAMES}), got dtype {x.dtype}")
    return dtype


def cast_for_dtype(input, dtype):
    """input as torch's ops with a dtype= argument see it: cast to dtype first, where that changes
    anything (an integer input; a narrower dtype, which rounds; float64 for a lower input, which the
    kernels then compute in: they computed a float32 input's sum in float32 and wrote float64). A
    16-bit input asked for float32 is the kernels' own reading of it: no pass. A dtype that is no
    floating dtype is left to the op's own check and message."""
    if dtype is None:  # the common case, answered first: every call of softmax and the sums asks
        return input
    try:
        want, have = as_dtype(dtype), as_dtype(input.dtype)
    except (TypeError, ValueError, AttributeError):
        return input
    if want == have or want not in FLOATING or (want == F32 and have in FLOATING and have != F64):
        return input
    return _C.cast(input, want)


def numel(x):
    return math.prod(int(s) for s in x.shape)


def is_number(x):
    """A Python or NumPy real number (np.int64(2) included), not a bool: what takes a float."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def shape_of(x, op, name="input"):
    """x's shape as a tuple, or not_an_array's TypeError."""
    shape = None if isinstance(x, (str, bytes)) else getattr(x, "shape", None)
    if shape is None:
        raise not_an_array(op, name, x)
    return tuple(shape)


def in_place(input, out, inplace):
    """out, or with inplace input holding out's values (torch's in-place forms: the caller's array
    changes and is returned)."""
    if not inplace or out is input:
        return out
    _C.cast(out, out=input)
    return input
