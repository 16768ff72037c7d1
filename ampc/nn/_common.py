"""What the modules of ampc.nn.functional share: the elementwise op table, the accumulation dtype
of a storage dtype, element counts. Its own module so that functional.py and the modules it
re-exports (_attention, _embedding) import it without importing each other."""

import functools
import inspect
import math
import operator

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


def not_an_array(op, name, x):
    """The TypeError the C entry points raise for an argument that is no array."""
    return TypeError(f"{op}: {name} must be an array (a NumPy ndarray, or an object with __dlpack__ such as a "
                     f"CuPy array, torch tensor or JAX array), got {type(x).__name__}")


def as_int(op, name, value, what="an int"):
    """An int (or what __index__ makes one: NumPy's integers), never a float truncated or a string
    parsed, as torch's int arguments: int(1.5) made an ignore_index of 1.5 ignore class 1."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{op}: {name} must be {what}, got {type(value).__name__}")
    return operator.index(value)


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


def non_array_error(fn, error, args, kwargs):
    """not_an_array's TypeError for the argument of fn(*args, **kwargs) whose missing array attribute
    raised error (the AttributeError's obj, Python 3.10+), an element of a list argument included;
    None when error is not about such an argument. Only the failure path pays for binding the
    arguments."""
    culprit = getattr(error, "obj", _NOTHING) if getattr(error, "name", None) in _ARRAY_ATTRIBUTES else _NOTHING
    if culprit is _NOTHING:
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a text signature: no names to give
        return None
    name = _holding(signature, args, kwargs, culprit)
    return None if name is None else not_an_array(fn.__name__, name, culprit)


def _holding(signature, args, kwargs, culprit):
    """The name of the argument that is (or lists) culprit, or None."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    for name, value in bound.arguments.items():
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
