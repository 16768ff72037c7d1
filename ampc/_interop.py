"""Which array library an array belongs to, and how a result goes back to the caller's own array type.

ampc._C asks converter_for(type) once per input type it meets and keeps the
answer: a function that turns an ampc.Array into that type without a copy
(through DLPack), or None to hand back the ampc.Array. Libraries are matched by
the module their type lives in, so none is imported unless its arrays appear.
array_namespace(x) gives the module whose functions take x (numpy, torch, ...):
what the shape ops call reshape, swapaxes or ones_like on.
"""

import importlib


def _torch(array):
    import torch

    return torch.from_dlpack(array)


def _cupy(array):
    import cupy

    return cupy.from_dlpack(array)


def _jax(array):
    import jax.dlpack

    return jax.dlpack.from_dlpack(array)


_BY_MODULE = {"torch": _torch, "cupy": _cupy, "jax": _jax, "jaxlib": _jax}


def library_of(tp):
    """The top-level module a type lives in ("numpy", "torch", "cupy", "jax", "jaxlib", "ampc", ...):
    how ampc tells its callers' array libraries apart without importing any of them."""
    return tp.__module__.partition(".")[0]


_NAMESPACES = {"numpy": "numpy", "torch": "torch", "cupy": "cupy", "jax": "jax.numpy", "jaxlib": "jax.numpy",
               "ampc": "ampc._array_namespace"}
_namespace_by_type = {}


def array_namespace(x):
    """The module whose functions take x: numpy, torch, cupy, jax.numpy, or ampc._array_namespace
    for ampc's own arrays."""
    found = _namespace_by_type.get(type(x))
    if found is None:
        name = _NAMESPACES.get(library_of(type(x)))
        if name is None:
            raise TypeError(f"expected a NumPy, torch, CuPy, JAX or ampc array, got {type(x).__name__}")
        found = _namespace_by_type[type(x)] = importlib.import_module(name)
    return found


def is_torch(x, name=None):
    """Whether x is torch's (its type lives in torch or under it: a Tensor, a Parameter), or, given
    a name, an instance of torch.<name> itself (torch.device, not torch.cuda.device). ampc._C
    recognises torch by the same rule (src/interop.c)."""
    tp = type(x)
    if name is None:
        return library_of(tp) == "torch"
    return tp.__module__ == "torch" and tp.__name__ == name


def converter_for(tp):
    return _BY_MODULE.get(library_of(tp))


def float32_for(tp):
    """The float32 dtype that a function on arrays of type tp takes as dtype= (autocast's
    fp32_set_opt_dtype policy passes it): torch.float32 for torch, NumPy's for NumPy, CuPy,
    JAX and the rest."""
    if library_of(tp) == "torch":
        import torch

        return torch.float32
    import numpy

    return numpy.dtype(numpy.float32)
