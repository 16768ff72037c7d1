"""Argument checks that autograd and ampc.nn share: int arguments taken as torch takes them, and
the TypeError that names an argument that is no array. Below autograd, so that autograd's tape
names a bad argument as the ops do without importing ampc.nn."""

import functools
import inspect
import operator


def not_an_array(op, name, x):
    """The TypeError the C entry points raise for an argument that is no array."""
    return TypeError(f"{op}: {name} must be an array (a NumPy ndarray, or an object with __dlpack__ such as a "
                     f"CuPy array, torch tensor or JAX array), got {type(x).__name__}")


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
