"""The shape ops, the glue between layers: reshape, transpose, permute, flatten, unsqueeze,
squeeze, cat, stack, split, chunk, and their backward passes.

These move no numbers that need precision, so they run in the array's own library (NumPy, torch,
CuPy, JAX), as views where that library makes views: ampc adds no copy. cat and stack are on
torch's promote list: under autocast their floating inputs meet in the widest dtype, as torch's.
"""

import math

from ampc._arguments import as_int, as_ints
from ampc._interop import array_namespace, is_torch
from ampc.amp import autocast_op
from ampc.nn._common import result_type, shape_of


def wrap_dim(op, dim, ndim, name="dim"):
    """dim as an index into ndim dimensions (a negative one counts from the end), or torch's IndexError
    (its maybe_wrap_dim: a 0-d array takes -1 and 0)."""
    dim = as_int(op, name, dim)
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"{op}: Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim % n


def _reshaped(op, input, shape, name):
    """input viewed (or copied, where its library must) as shape, checked as torch checks it."""
    size = math.prod(shape_of(input, op))
    shape = as_ints(op, name, shape)
    known = math.prod(s for s in shape if s != -1)
    if shape.count(-1) > 1 or any(s < -1 for s in shape) or (
            known != size if -1 not in shape else known == 0 or size % known != 0):
        raise ValueError(f"{op}: shape '{list(shape)}' is invalid for input of size {size}")  # torch's text
    return array_namespace(input).reshape(input, shape)


def reshape(input, shape):
    """input's elements in a new shape (one dimension may be -1), as torch.reshape: a view where the layout allows."""
    return _reshaped("reshape", input, shape, "shape")


def reshape_backward(grad_output, input_shape):
    """The gradient of reshape's input: the gradient in the input's shape."""
    return _reshaped("reshape_backward", grad_output, input_shape, "input_shape")


def transpose(input, dim0, dim1):
    """input with dimensions dim0 and dim1 swapped, as torch.transpose: a view."""
    nd = len(input.shape)
    return array_namespace(input).swapaxes(input, wrap_dim("transpose", dim0, nd, "dim0"),
                                           wrap_dim("transpose", dim1, nd, "dim1"))


def transpose_backward(grad_output, dim0, dim1):
    """The gradient of transpose's input: the gradient with the same two dimensions swapped back."""
    nd = len(grad_output.shape)
    return transpose(grad_output, wrap_dim("transpose_backward", dim0, nd, "dim0"),
                     wrap_dim("transpose_backward", dim1, nd, "dim1"))


def permute(input, dims):
    """input with its dimensions in the order dims, as torch.permute: a view."""
    nd = len(input.shape)
    dims = tuple(wrap_dim("permute", d, nd, "dims") for d in as_ints("permute", "dims", dims))
    if sorted(dims) != list(range(nd)):
        raise ValueError(f"permute: dims {dims} are not a permutation of the input's {nd} dimensions")
    lib = array_namespace(input)
    return lib.permute(input, dims) if is_torch(input) else lib.transpose(input, dims)


def permute_backward(grad_output, dims):
    """The gradient of permute's input: the gradient with the inverse permutation."""
    nd = len(grad_output.shape)
    dims = [wrap_dim("permute_backward", d, nd, "dims") for d in as_ints("permute_backward", "dims", dims)]
    inverse = [0] * nd
    for i, d in enumerate(dims):
        inverse[d] = i
    return permute(grad_output, inverse)


def flatten(input, start_dim=0, end_dim=-1):
    """input with dimensions start_dim..end_dim merged into one, as torch.flatten."""
    shape = tuple(input.shape)
    if not shape:
        return reshape(input, (1,))
    s, e = wrap_dim("flatten", start_dim, len(shape), "start_dim"), wrap_dim("flatten", end_dim, len(shape), "end_dim")
    if s > e:
        raise ValueError("flatten: start_dim cannot come after end_dim")
    n = 1
    for d in shape[s:e + 1]:
        n *= d
    return reshape(input, shape[:s] + (n,) + shape[e + 1:])


def unsqueeze(input, dim):
    """input with a dimension of size 1 inserted at dim, as torch.unsqueeze: a view."""
    shape = tuple(input.shape)
    d = wrap_dim("unsqueeze", dim, len(shape) + 1)
    return reshape(input, shape[:d] + (1,) + shape[d:])


def squeeze(input, dim=None):
    """torch.squeeze: the dimensions of size 1 among dim (an int or a tuple of them; None: all) dropped."""
    shape = tuple(input.shape)
    if dim is None:
        return reshape(input, tuple(s for s in shape if s != 1))
    dims = {wrap_dim("squeeze", d, len(shape)) for d in as_ints("squeeze", "dim", dim, "an int or a tuple of ints")}
    kept = tuple(s for d, s in enumerate(shape) if not (d in dims and s == 1))
    return reshape(input, kept) if kept != shape else input


def _slice(x, dim, start, stop):
    lib = array_namespace(x)
    if hasattr(lib, "take_slice"):
        return lib.take_slice(x, dim, start, stop)
    return x[(slice(None),) * dim + (slice(start, stop),)]


def _array_list(op, tensors):
    """cat's or stack's tensors as a non-empty list of arrays of one library: NumPy would take None
    or a string as a 0-d array and speak of dimensions or shapes."""
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}: tensors must be a list or tuple of arrays, got {type(tensors).__name__}")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(f"{op}: expected a non-empty list of arrays")
    for t in tensors:
        shape_of(t, op, "each of tensors")
    for i, t in enumerate(tensors):
        if array_namespace(t) is not array_namespace(tensors[0]):
            raise TypeError(f"{op}: expected arrays of one library, got {type(tensors[0]).__name__} (tensor number 0) "
                            f"and {type(t).__name__} (tensor number {i})")
    return tensors


def _joined(op, arrays, dim, dtypes):
    """arrays joined along dim (cat) or stacked along a new dim (stack) in their library's function,
    in torch's promotion of dtypes (torch's own functions promote so; NumPy would make float32 with
    int32 float64, and ampc's own arrays took the first array's dtype)."""
    lib = array_namespace(arrays[0])
    if is_torch(arrays[0]):
        return getattr(lib, op)(arrays, dim)
    return getattr(lib, "concatenate" if op == "cat" else "stack")(arrays, dim, dtype=result_type(op, dtypes))


@autocast_op(name="cat")
def cat(tensors, dim=0):
    """torch.cat: arrays of one library joined along dim, their dtypes promoted as torch's. As in
    torch, a 1-D empty array joins any other (torch's legacy empty tensor): only its dtype counts."""
    tensors = _array_list("cat", tensors)
    for i, t in enumerate(tensors):
        if not t.shape:
            raise ValueError(f"cat: zero-dimensional tensor (at position {i}) cannot be concatenated")  # torch's texts
    kept = [(i, t) for i, t in enumerate(tensors) if tuple(t.shape) != (0,)] or [(0, tensors[0])]
    shape = tuple(kept[0][1].shape)
    dim = wrap_dim("cat", dim, len(shape))
    for i, t in kept[1:]:
        other = tuple(t.shape)
        if len(other) != len(shape):
            raise ValueError(f"cat: Tensors must have same number of dimensions: got {len(shape)} and {len(other)}")
        for d, (want, got) in enumerate(zip(shape, other)):
            if d != dim and want != got:
                raise ValueError(f"cat: Sizes of tensors must match except in dimension {dim}. Expected size "
                                 f"{want} but got size {got} for tensor number {i} in the list.")
    return _joined("cat", [t for _, t in kept], dim, [t.dtype for t in tensors])


def cat_backward(grad_output, sizes, dim=0):
    """The gradients of cat's inputs: grad_output cut into sizes along dim (views)."""
    dim = wrap_dim("cat_backward", dim, len(grad_output.shape))
    out, start = [], 0
    for n in as_ints("cat_backward", "sizes", sizes):
        out.append(_slice(grad_output, dim, start, start + n))
        start += n
    if start != grad_output.shape[dim]:
        raise ValueError(f"cat_backward: sizes add up to {start}, but grad_output has {grad_output.shape[dim]} "
                         f"along dim {dim}")
    return out


@autocast_op(name="stack")
def stack(tensors, dim=0):
    """torch.stack: arrays of one shape and library stacked along a new dim, promoted as cat."""
    tensors = _array_list("stack", tensors)
    shape = tuple(tensors[0].shape)
    dim = wrap_dim("stack", dim, len(shape) + 1)
    for i, t in enumerate(tensors):
        if tuple(t.shape) != shape:
            raise ValueError(f"stack: stack expects each tensor to be equal size, but got {list(shape)} at entry 0 "
                             f"and {list(t.shape)} at entry {i}")  # torch's text
    return _joined("stack", tensors, dim, [t.dtype for t in tensors])


def stack_backward(grad_output, count, dim=0):
    """The gradients of stack's count inputs: grad_output's slices along dim (count of them)."""
    dim = wrap_dim("stack_backward", dim, len(grad_output.shape))
    count = as_int("stack_backward", "count", count)
    if count != grad_output.shape[dim]:
        raise ValueError(f"stack_backward: count ({count}) must be grad_output's size along dim {dim} "
                         f"({grad_output.shape[dim]})")
    return [squeeze(_slice(grad_output, dim, i, i + 1), dim) for i in range(count)]


def split(tensor, split_size_or_sections, dim=0):
    """torch.split: pieces of split_size along dim (the last may be shorter), or of the listed sizes."""
    dim = wrap_dim("split", dim, len(tensor.shape))
    n = tensor.shape[dim]
    if not isinstance(split_size_or_sections, (list, tuple)):
        size = as_int("split", "split_size_or_sections", split_size_or_sections, "an int or a list of ints")
        if size <= 0:
            raise ValueError(f"split: split_size must be positive, got {size}")
        sizes = [min(size, n - s) for s in range(0, n, size)] or [0]
    else:  # int() took [1.5, 2.5] for [1, 2]
        sizes = [as_int("split", "split_size_or_sections", s, "an int or a list of ints")
                 for s in split_size_or_sections]
        if sum(sizes) != n:
            raise ValueError(f"split: split_sizes add up to {sum(sizes)}, but the dimension has {n}")
    return tuple(cat_backward(tensor, sizes, dim))


def chunk(input, chunks, dim=0):
    """torch.chunk: at most `chunks` pieces of ceil(n / chunks) along dim."""
    chunks = as_int("chunk", "chunks", chunks)
    if chunks <= 0:
        raise ValueError(f"chunk: chunks must be positive, got {chunks}")
    n = input.shape[wrap_dim("chunk", dim, len(input.shape))]
    return split(input, max(-(-n // chunks), 1), dim)
