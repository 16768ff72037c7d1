"""NumPy's shape functions for ampc.Array (parameters moved to a GPU by Module.to live in ampc's
pool as ampc arrays): the array namespace of ampc's own arrays, where the shape ops
(ampc.nn._shape_ops) find them as they find numpy's or torch's (ampc._interop.array_namespace).
Views where the layout allows (Array._view checks each stays inside its array's memory); otherwise a
copy through ampc's cast kernels, into a C-order array from ampc's pool."""

import math

import numpy as np

from ampc import _C


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _resolve(shape, size):
    shape = [int(s) for s in shape]
    if shape.count(-1) > 1:
        raise ValueError("reshape: only one dimension can be inferred")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or size % known:
            raise ValueError(f"reshape: cannot reshape an array of size {size} into shape {tuple(shape)}")
        shape[shape.index(-1)] = size // known
    if math.prod(shape) != size:
        raise ValueError(f"reshape: cannot reshape an array of size {size} into shape {tuple(shape)}")
    return tuple(shape)


def _is_c_contiguous(x):
    """C order, the strides of dimensions of size 1 aside (they never step)."""
    shape = tuple(x.shape)
    return all(n == 1 or s == c for n, s, c in zip(shape, x.strides, _c_strides(shape, x.itemsize)))


def contiguous(x):
    """x itself if C-contiguous, else a C-order copy."""
    if _is_c_contiguous(x):
        return x
    out = _C.zeros_like(x, shape=tuple(x.shape))
    _C.cast(x, out=out)
    return out


def reshape(x, shape):
    if isinstance(shape, int):
        shape = (shape,)
    shape = _resolve(shape, x.size)
    x = contiguous(x)
    return x._view(shape, _c_strides(shape, x.itemsize), 0)


def transpose(x, axes=None):
    axes = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    return x._view(tuple(x.shape[a] for a in axes), tuple(x.strides[a] for a in axes), 0)


def swapaxes(x, a, b):
    axes = list(range(x.ndim))
    axes[a], axes[b] = axes[b], axes[a]
    return transpose(x, axes)


def take_slice(x, dim, start, stop):
    """x[..., start:stop, ...] along dim (0 <= start <= stop <= x.shape[dim]), a view."""
    shape = list(x.shape)
    shape[dim] = stop - start
    return x._view(tuple(shape), tuple(x.strides), start * x.strides[dim] if stop > start else 0)


def getitem(x, key):
    """x[key] for ints and slices with step 1 (a view)."""
    key = key if isinstance(key, tuple) else (key,)
    if len(key) > x.ndim or not all(isinstance(k, (int, slice)) for k in key):
        raise IndexError("ampc arrays take ints and slices as indices")
    shape, strides, offset = [], [], 0
    for d, k in enumerate(key):
        n = x.shape[d]
        if isinstance(k, int):
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for dimension {d} with size {n}")
            offset += (k % n) * x.strides[d]
            continue
        start, stop, step = k.indices(n)
        if step != 1:
            raise IndexError("ampc arrays take slices with step 1")
        shape.append(max(stop - start, 0))
        strides.append(x.strides[d])
        offset += start * x.strides[d] if stop > start else 0
    shape += list(x.shape[len(key):])
    strides += list(x.strides[len(key):])
    return x._view(tuple(shape), tuple(strides), offset)


def concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    if dtype is not None and np.dtype(dtype).kind in "biu" and any(a.dtype != dtype for a in arrays):
        given = ", ".join(str(a.dtype) for a in arrays)
        raise TypeError(f"cat: ampc's arrays convert to floating dtypes only, not {given} to {np.dtype(dtype)}")
    shape = list(arrays[0].shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    out = _C.zeros_like(arrays[0], dtype=dtype, shape=tuple(shape))
    start = 0
    for a in arrays:
        _C.cast(a, out=take_slice(out, axis, start, start + a.shape[axis]))
        start += a.shape[axis]
    return out


def stack(arrays, axis=0, dtype=None):
    arrays = [reshape(a, a.shape[:axis] + (1,) + a.shape[axis:]) for a in arrays]
    return concatenate(arrays, axis, dtype)


def zeros(shape, dtype=None, like=None):
    return _C.zeros_like(like, dtype=dtype, shape=tuple(shape))


def ones_like(x):
    return _C.cast(_C._ew(_C._ew_ops()["copy"], _C._scalar_like(x, 1.0), shape=tuple(x.shape)), x.dtype)


def arange(n, like):
    """0 .. n-1 as int64, on like's device."""
    device = -1 if like.device == "cpu" else int(str(like.device).split(":")[1])
    return _C._to_device(np.arange(n, dtype=np.int64), device)
