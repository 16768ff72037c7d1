"""What the modules of ampc.nn.functional share: the elementwise op table, the accumulation dtype
of a storage dtype, element counts. Its own module so that functional.py and the modules it
re-exports (_attention, _embedding) import it without importing each other."""

import functools
import inspect
import math
import numbers
import operator

import ml_dtypes
import numpy as np

from ampc import _C
from ampc._C import as_dtype

OPS = _C._ew_ops()
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)


def acc_dtype(dtype):
    """The dtype the kernels accumulate in for data of this dtype."""
    return F64 if dtype == F64 else F32


FLOATING = {F32, F64, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}  # the dtypes ampc computes on


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
        raise TypeError(f"{op}: {name} must be a floating array (float32, float16, bfloat16 or float64), "
                        f"got dtype {x.dtype}")
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


def not_an_array(op, name, x):
    """The TypeError the C entry points raise for an argument that is no array."""
    return TypeError(f"{op}: {name} must be an array (a NumPy ndarray, or an object with __dlpack__ such as a "
                     f"CuPy array, torch tensor or JAX array), got {type(x).__name__}")


def is_number(x):
    """A Python or NumPy real number (np.int64(2) included), not a bool: what takes a float."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def as_int(op, name, value, what="an int"):
    """An int (or what __index__ makes one: NumPy's integers), never a float truncated or a string
    parsed, as torch's int arguments: int(1.5) made an ignore_index of 1.5 ignore class 1."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:  # no __index__, or an array of more than one element
            pass
    raise TypeError(f"{op}: {name} must be {what}, got {type(value).__name__}")


def as_ints(op, name, values, what="an int or a sequence of ints"):
    """A tuple of ints from an int or a sequence of them (a shape, a list of dims), each as as_int
    takes it: a float array's tuple() made NumPy's message, naming neither op nor argument."""
    if type(values) is tuple:  # the common case, checked first: every op with a shape asks this
        for v in values:
            if type(v) is not int:
                break
        else:
            return values
    if not isinstance(values, bool) and hasattr(type(values), "__index__") and getattr(values, "ndim", 0) == 0:
        return (as_int(op, name, values, what),)
    if not isinstance(values, (list, tuple)) and getattr(values, "ndim", None) != 1:  # a dict or set is no shape
        raise TypeError(f"{op}: {name} must be {what}, got {type(values).__name__}")
    return tuple(as_int(op, name, v, what) for v in values)


def shape_of(x, op, name="input"):
    """x's shape as a tuple, or not_an_array's TypeError."""
    shape = None if isinstance(x, (str, bytes)) else getattr(x, "shape", None)
    if shape is None:
        raise not_an_array(op, name, x)
    return tuple(shape)


_ARRAY_ATTRIBUTES = frozenset({"shape", "dtype", "ndim", "strides", "T", "__dlpack__", "__dlpack_device__"})
_NOTHING = object()


def names_non_arrays(fn):
    """fn, where an argument that is no array (a list, None, a string) answers with not_an_array's
    TypeError naming it, not with the AttributeError of the first line of Python that read its .shape
    or .dtype. (The differentiable ops do the same inside their own wrapper, autograd's call.)"""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AttributeError as error:
            named = non_array_error(fn, error, args, kwargs)
            if named is None:
                raise
            raise named from None

    return call


def non_array_error(fn, error, args, kwargs, passed=None):
    """not_an_array's TypeError for the argument of fn(*args, **kwargs) whose missing array attribute
    raised error (the AttributeError's obj, Python 3.10+), an element of a list argument included;
    None when error is not about such an argument. passed: the arguments by name as fn's body got
    them, where a wrapper replaced some (autograd's call makes a list argument a new list). Only the
    failure path pays for binding the arguments."""
    culprit = getattr(error, "obj", _NOTHING) if getattr(error, "name", None) in _ARRAY_ATTRIBUTES else _NOTHING
    if culprit is _NOTHING:
        return None
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # a builtin without a text signature, or arguments that do not bind
        bound = {}
    name = _holding(bound, culprit) or _holding(passed or {}, culprit)
    return None if name is None else not_an_array(fn.__name__, name, culprit)


def _holding(arguments, culprit):
    """The name of the argument that is (or lists) culprit, or None."""
    for name, value in arguments.items():
        if value is culprit:
            return name
        if isinstance(value, (list, tuple)) and any(v is culprit for v in value):
            return f"each of {name}"
        if isinstance(value, str) and isinstance(culprit, str) and culprit in value:  # its characters
            return name
    return None


def in_place(input, out, inplace):
    """out, or with inplace input holding out's values (torch's in-place forms: the caller's array
    changes and is returned)."""
    if not inplace or out is input:
        return out
    _C.cast(out, out=input)
    return input
