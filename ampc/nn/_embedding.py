"""embedding and dropout: the rows of a table, and a random mask. Both keep their input's dtype
(torch's autocast lists neither)."""

from ampc import _C, random
from ampc._arguments import as_int
from ampc._interop import array_namespace, is_torch, library_of
from ampc.nn._common import OPS, in_place, is_number, numel as _numel, shape_of as _shape_of


def _padding_index(op, padding_idx, num):
    """torch's padding_idx: None, or an index in [-num, num), taken modulo num."""
    if padding_idx is None:
        return -1
    padding_idx = as_int(op, "padding_idx", padding_idx)
    if not -num <= padding_idx < num:
        raise ValueError(f"{op}: Padding_idx must be within num_embeddings, got {padding_idx} for {num} rows")
    return padding_idx % num


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False):
    """The rows of weight (num_embeddings, embedding_dim) that input's integers name, shaped
    input.shape + (embedding_dim,). An index outside the table raises ValueError on the CPU and
    gives a row of NaN on a GPU (looking would wait for the device)."""
    if sparse:
        raise NotImplementedError("embedding: sparse gradients are not supported")
    if len(weight.shape) == 2:
        _padding_index("embedding", padding_idx, weight.shape[0])
    if max_norm is not None:
        renorm_(weight, input, float(max_norm), float(norm_type))
    return _C._embedding(weight, input)


def renorm_(weight, input, max_norm, norm_type=2.0):
    """torch.embedding_renorm_: the rows of weight that input names and whose norm_type-norm is above
    max_norm, scaled in place by max_norm / (norm + 1e-7) (the norm and the factor in float64, as
    torch's CPU kernel). NumPy, CuPy and torch arrays (torch's own kernel for torch's)."""
    data = weight.data if isinstance(weight, _C.Parameter) else weight
    root = library_of(type(data))
    if root not in ("torch", "numpy", "cupy"):
        raise NotImplementedError(f"embedding: max_norm takes NumPy, CuPy or torch weights, not {type(data).__name__}")
    # Everything the lookup checks, before any row is written (a refused call changes nothing): the
    # lookup of no index checks weight, input's dtype and device; every index is checked below.
    _C._embedding(weight, input[:0] if len(_shape_of(input, "embedding")) > 0 else input)
    if root == "torch":
        import torch

        _check_rows("embedding", torch.unique(input), data.shape[0])
        with torch.no_grad():
            torch.embedding_renorm_(data, input, max_norm, norm_type)
    else:
        import importlib

        lib = importlib.import_module(root)
        rows = lib.unique(lib.asarray(input).ravel())  # sorted (and on a GPU, on the host once counted)
        _check_rows("embedding", rows, data.shape[0])
        picked = data[rows].astype(lib.float64)
        norms = lib.linalg.norm(picked, ord=norm_type, axis=1) if norm_type != float("inf") else \
            lib.abs(picked).max(axis=1)
        scale = lib.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
        data[rows] = (picked * scale[:, None]).astype(data.dtype)
    if isinstance(weight, _C.Parameter):
        weight.bump_version()  # autocast's cached copies of it are stale


def _check_rows(op, rows, num):
    """The ValueError of the lookup (ops_embedding.c) for sorted unique indices outside [0, num): torch's
    renorm takes -1 for the last row (it renormalised row 4 of 5, then the lookup refused -1), a GPU
    would write through any index. The check costs the GPU nothing more: counting the unique indices
    already waited for it."""
    if len(rows) == 0:
        return
    for bad in (int(rows[0]), int(rows[-1])):
        if not 0 <= bad < num:
            raise ValueError(f"{op}: input holds the index {bad}, outside the {num} rows of weight")


def embedding_backward(grad_output, input, num_weights, padding_idx=None, scale_grad_by_freq=False):
    """grad_weight (num_weights, embedding_dim) in grad_output's dtype: each row the sum of the
    gradients of the positions that named it, added in position order (the same bits on the CPU
    and a GPU); the row padding_idx gets none. scale_grad_by_freq divides each row by the count of
    its index in input, as torch."""
    num_weights = as_int("embedding_backward", "num_weights", num_weights)
    grad = _C._embedding_backward(grad_output, input, num_weights,
                                  _padding_index("embedding_backward", padding_idx, num_weights))
    if not scale_grad_by_freq:
        return grad
    return _C._ew(OPS["div"], grad, _index_counts(input, num_weights), dtype=grad.dtype, name="embedding_backward",
                  names=("grad_output", "input"))


def _index_counts(input, n):
    """How often each of 0 .. n-1 occurs in input (at least 1: rows never named have no gradient to
    scale), as an (n, 1) integer array of input's library."""
    lib = array_namespace(input)
    flat = lib.reshape(input, (-1,))
    if is_torch(input):
        counts = lib.bincount(flat, minlength=n)
    elif lib.__name__.startswith("jax"):
        counts = lib.bincount(flat, length=n)
    else:
        counts = lib.bincount(flat, minlength=n)
    return lib.reshape(lib.clip(counts, 1, None), (n, 1))


def _check_p(p, op="dropout"):
    if not is_number(p):
        raise TypeError(f"{op}: p must be a float, got {type(p).__name__}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return float(p)


def dropout_forward(input, p=0.5, training=True):
    """(output, state): dropout, and the (seed, offset) of its mask for dropout_backward (None when
    nothing was dropped: evaluation)."""
    p = _check_p(p)
    _shape_of(input, "dropout")
    if not training:
        return input, None
    state = random._draw(_numel(input))
    return _C._dropout(input, p, *state), state


def dropout(input, p=0.5, training=True, inplace=False):
    """torch.nn.functional.dropout: each element zeroed with probability p, the others scaled by
    1 / (1 - p), from ampc.random's stream (seeded by ampc.random.manual_seed; the CPU and a GPU
    draw the same mask). inplace writes the result into input."""
    return in_place(input, dropout_forward(input, p, training)[0], inplace)


def dropout_backward(grad_output, state, p=0.5):
    """The gradient of dropout's input: grad_output through the forward's mask (state as
    dropout_forward returned it; None for evaluation: grad_output itself)."""
    if state is None:
        return grad_output
    if not isinstance(state, tuple):
        raise TypeError(f"dropout_backward: state must be what dropout's forward returned (a tuple) or None, "
                        f"got {type(state).__name__}")
    return _C._dropout(grad_output, _check_p(p, "dropout_backward"), *state)

