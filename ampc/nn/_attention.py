"""scaled_dot_product_attention and its backward pass, on the lower-precision list as in torch.

On a GPU (sm_80 on), for 16-bit query, key and value of head dimension 64 without a mask
(grouped query heads and dropout too), the fused kernels of cuda/attention.cu run it (FlashAttention-2: the scores never reach
memory; the tape keeps the output and each query's log-sum-exp, from which the backward pass
recomputes the probabilities tile by tile).

Elsewhere it is composed from ampc's kernels the way a fused attention kernel keeps its precision:
the scores q @ k^T * scale come out of the matrix product in float32 (float32 accumulation, no
rounding to 16 bits), the mask is added there, the softmax runs in float32 with the causal mask
applied inside the kernel (no mask array) and rounds the probabilities once to the inputs' dtype,
and probabilities @ v accumulates in float32 again. The probabilities take B * H * L * S values:
the tape does not keep them between the passes; the backward recomputes them, bit for bit, and
dropout's mask from its seed and offset.

Grouped-query attention (enable_gqa: G query heads per key/value head) copies nothing: the G query
heads of a key/value head are viewed as one head of G * L rows, so each product reads the shared
keys and values once (and the backward's products sum the G heads' key and value gradients).

On the CPU, a causal self-attention of 2 * CAUSAL_BAND_ROWS queries or more (no mask, no dropout)
is composed a band of queries at a time: a band's rows see only the keys up to its last query, so its
products and softmax take those keys alone (the softmax's causal_offset says where the band
starts) and skip the upper triangle's blocks that the whole matrix would compute, round to zeros
and multiply through. Four bands: (1 + 2 + 3 + 4) / 16 = 62.5 % of the scores' work and memory.
The backward recomputes each band's probabilities and sums the bands' key and value gradients in
float32, rounding them once.
"""

import math
import os

import numpy as np

from ampc import _C, random
from ampc._interop import array_namespace, is_torch
from ampc.amp import autocast_op
from ampc.nn._common import OPS as _OPS, acc_dtype as _acc, floating_dtype, numel as _numel
from ampc.nn._embedding import _check_p, dropout_backward
from ampc.nn._shape_ops import _slice, cat, reshape


def _check(query, key, value, attn_mask, is_causal, enable_gqa):
    op = "scaled_dot_product_attention"
    if len(query.shape) < 2 or len(key.shape) < 2 or len(value.shape) < 2:
        raise ValueError(f"{op}: query, key and value need 2 dimensions or more (..., L, E)")
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"{op}: key has {key.shape[-1]} features per position, query {query.shape[-1]}")
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(f"{op}: value has {value.shape[-2]} positions, key {key.shape[-2]}")
    if tuple(key.shape[:-2]) != tuple(value.shape[:-2]) or (
            tuple(query.shape[:-2]) != tuple(key.shape[:-2]) and _groups(query, key, enable_gqa) == 1):
        raise ValueError(f"{op}: query, key and value must have the same batch dimensions, got "
                         f"{tuple(query.shape[:-2])}, {tuple(key.shape[:-2])} and {tuple(value.shape[:-2])}"
                         + ("" if enable_gqa else " (enable_gqa=True lets query have a multiple of key's heads)"))
    if is_causal and attn_mask is not None:
        raise ValueError(f"{op}: Explicit attn_mask should not be set when is_causal=True")


def _groups(query, key, enable_gqa):
    """G, the query heads per key/value head, for enable_gqa: query (..., G * H, L, E) against key
    (..., H, S, E); 1 otherwise or when the shapes do not group."""
    q, k = tuple(query.shape), tuple(key.shape)
    if not enable_gqa or len(q) < 3 or len(q) != len(k) or q[:-3] != k[:-3] or k[-3] == 0 or q[-3] % k[-3]:
        return 1
    return q[-3] // k[-3]


def _scale(query, scale):
    """1 / sqrt(E) unless given. With E = 0 the scores are empty sums, 0 whatever the scale (torch
    scales q and k before their product and gives the mean of v): 1 there, not a division by 0."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(query.shape[-1]) if query.shape[-1] else 1.0


def _additive_mask(attn_mask):
    """(mask, live): a boolean mask (True: attend) as 0 / -inf in float32, a float mask as it is;
    with the rows that attend to nothing (every key -inf) made 0 in it, and live (..., L, 1) 0 for
    those rows and 1 for the rest. torch (2.5 on) gives such a row 0 where the softmax of -inf
    alone is NaN: the probabilities are multiplied by live (the gradients then follow). (live is
    None for a mask of ampc's own arrays, which have no where(): there such a row stays NaN.)"""
    lib = array_namespace(attn_mask)
    if not hasattr(lib, "where"):  # ampc's own arrays (a Module's parameters on a GPU): float masks as they are
        return attn_mask, None
    torch = is_torch(attn_mask)
    zero = 0.0 if torch else lib.zeros((), dtype=lib.float32)
    mask = lib.where(attn_mask, zero, -math.inf) if str(attn_mask.dtype) in ("bool", "torch.bool") else attn_mask
    blocked = mask == -math.inf
    dead = lib.all(blocked, dim=-1, keepdim=True) if torch else lib.all(blocked, axis=-1, keepdims=True)
    return lib.where(dead, zero, mask), lib.where(dead, zero, 1.0 if torch else lib.ones((), dtype=lib.float32))


# AMPC_FUSED_ATTENTION=0 composes every attention (as torch.backends.cuda.enable_flash_sdp(False)
# turns its flash kernel off): for comparing the two, or as a way round a kernel's fault.
FUSED = os.environ.get("AMPC_FUSED_ATTENTION", "1") != "0"


class Fused:
    """What the fused forward leaves the backward pass: its output, each query's log-sum-exp of
    its scaled scores (float32, (batch, heads, L)), and its dropout's p and (seed, offset)."""

    __slots__ = ("output", "lse", "dropout_p", "dropout_state")

    def __init__(self, output, lse, dropout_p, dropout_state):
        self.output, self.lse, self.dropout_p, self.dropout_state = output, lse, dropout_p, dropout_state


def draw_dropout(query, key, dropout_p):
    """The (seed, offset) of the attention's dropout mask, one number per probability (None without
    dropout): drawn before the fused kernels or the composed path run, so that either drops the
    same elements."""
    if _check_p(dropout_p, "scaled_dot_product_attention") == 0.0:
        return None
    return random._draw(math.prod(int(n) for n in query.shape[:-1]) * int(key.shape[-2]))


def fused_forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
                  dropout_state=None):
    """(output, Fused) from the fused kernels, or None where they do not serve these arguments
    (NumPy arrays, a mask, other dtypes or shapes: ampc._C._attention says). Grouped query heads
    (enable_gqa) they take as they are: query head h reads key/value head h // G. Dropout draws
    at dropout_state (draw_dropout's; drawn here when not given)."""
    if not FUSED or attn_mask is not None or isinstance(query, np.ndarray):
        return None
    _check(query, key, value, attn_mask, is_causal, enable_gqa)
    if dropout_state is None:
        dropout_state = draw_dropout(query, key, dropout_p)
    p = float(dropout_p) if dropout_state is not None else 0.0
    served = _C._attention(query, key, value, bool(is_causal), _scale(query, scale), p, *(dropout_state or (0, 0)))
    return None if served is None else (served[0], Fused(served[0], served[1], p, dropout_state))


def fused_backward(grad_output, query, key, value, fused, is_causal=False, scale=None):
    """(grad_query, grad_key, grad_value) from the fused kernels, or None where they do not serve
    (grad_output laid out so that its rows are not 16-byte aligned)."""
    return _C._attention_backward(grad_output, query, key, value, fused.output, fused.lse, bool(is_causal),
                                  _scale(query, scale), fused.dropout_p, *(fused.dropout_state or (0, 0)))


def _forward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False,
             dropout_state=None):
    """(output, probs, dropout_state): the attention, its probabilities (the inputs' dtype; for
    grouped queries, shaped (..., H, G * L, S)) and the (seed, offset) of its dropout mask (None
    without dropout; drawn here unless given)."""
    _check(query, key, value, attn_mask, is_causal, enable_gqa)
    probs = probabilities(query, key, attn_mask, is_causal, scale, enable_gqa)
    state = dropout_state
    attended = probs
    if _check_p(dropout_p, "scaled_dot_product_attention") > 0.0:
        state = state or random._draw(_numel(probs))
        attended = _C._dropout(probs, float(dropout_p), *state)
    out = _C._matmul(attended, value, op="scaled_dot_product_attention")
    groups = _groups(query, key, enable_gqa)
    return (out if groups == 1 else reshape(out, tuple(query.shape[:-1]) + (value.shape[-1],))), probs, state


def probabilities(query, key, attn_mask=None, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q @ k^T * scale + mask) in the inputs' dtype (grouped queries: (..., H, G * L, S)),
    the same bits every time: the backward pass recomputes them rather than keep B * H * L * S
    values per layer between the passes, as a fused kernel does (GPT-2 small at 8 x 1024 tokens:
    2.4 GB in 16 bits), for one more product and softmax per layer."""
    dtype = floating_dtype("scaled_dot_product_attention", "query", query)
    groups = _groups(query, key, enable_gqa)
    q = query if groups == 1 else reshape(query, tuple(key.shape[:-2]) + (groups * query.shape[-2], query.shape[-1]))
    scores = _C._matmul(q, key, transpose_b=True, alpha=_scale(query, scale), dtype=_acc(dtype),
                        op="scaled_dot_product_attention")
    by_head = tuple(key.shape[:-2]) + (groups, query.shape[-2], key.shape[-2])  # (..., H, G, L, S)
    if groups > 1:
        scores = reshape(scores, by_head)  # each query head's L rows: the causal mask counts from 0
    live = None
    if attn_mask is not None:
        mask, live = (None if m is None else _grouped(m, groups) for m in _additive_mask(attn_mask))
        scores = _C._ew(_OPS["add"], scores, mask, dtype=_acc(dtype))
    probs = _C._softmax(scores, -1, False, dtype, causal=bool(is_causal))
    if live is not None:
        probs = _C._ew(_OPS["mul"], probs, live, dtype=dtype)
    if groups > 1:
        probs = reshape(probs, tuple(q.shape[:-1]) + (key.shape[-2],))
    return probs


def _grouped(mask, groups):
    """A mask (or its live rows), shaped to broadcast over (..., H, G, L, S) scores when heads are grouped."""
    if groups == 1:
        return mask
    shape = tuple(mask.shape)
    if len(shape) >= 3 and shape[-3] > 1:  # per query head: (..., G * H, L, S) -> (..., H, G, L, S)
        return reshape(mask, shape[:-3] + (shape[-3] // groups, groups) + shape[-2:])
    return reshape(mask, shape[:-2] + (1,) + shape[-2:]) if len(shape) >= 3 else mask


# Bands of queries for a causal self-attention: at least CAUSAL_BAND_ROWS rows each (a product of
# fewer rows runs below the matrix units' speed) and at most CAUSAL_BANDS of them (each costs its
# launches, and the fourth band already skips 37.5 % of the work: more bands gain less each).
CAUSAL_BAND_ROWS = 256
CAUSAL_BANDS = 4


def _on_host(x):
    """Whether x lives in the host's memory (NumPy arrays, torch's CPU tensors)."""
    return str(getattr(x, "device", "cpu")).startswith("cpu")


def causal_bands(query, key, attn_mask=None, dropout_p=0.0, is_causal=False):
    """The (first, stop) query rows of each band where the attention is composed by bands (on the
    host, causal, as many queries as keys, no mask or dropout, two bands or more), else None.
    Dropout's mask numbers the whole matrix's elements, which a band's does not see. On a GPU the
    whole matrix's products ran GPT-2's float32 step faster (H100, side by side: 191.6 ms a step
    against 206.5 by bands, whose products launched as many smaller GEMMs), though bands took a
    fifth off the bare forward's time; on the host, bands took a quarter off the forward and
    backward of 12 heads of 1024 x 64 (benchmarks/ops_cpu.py --only attention: 94.7 ms against
    127.5)."""
    if not is_causal or attn_mask is not None or float(dropout_p) != 0.0 or not _on_host(query):
        return None
    length = int(query.shape[-2])
    if length != int(key.shape[-2]):
        return None
    rows = max(CAUSAL_BAND_ROWS, -(-length // CAUSAL_BANDS))
    if length < 2 * rows:
        return None
    return [(first, min(first + rows, length)) for first in range(0, length, rows)]


def _query_rows(x, key, groups, first, stop):
    """Rows first..stop of each query head of x (query or grad_output, (..., G * H, L, E)), as the
    products take them: (..., H, G * (stop - first), E) for grouped heads (a copy: the G heads'
    bands are not one run), (..., L', E) otherwise (a view)."""
    if groups == 1:
        return _slice(x, len(x.shape) - 2, first, stop)
    heads = tuple(key.shape[:-2]) + (groups,) + tuple(x.shape[-2:])  # (..., H, G, L, E)
    band = _slice(reshape(x, heads), len(heads) - 2, first, stop)
    return reshape(band, tuple(key.shape[:-2]) + (groups * (stop - first), x.shape[-1]))


def _keys_to(x, stop):
    """Keys (or values) 0..stop: those a band ending at query stop - 1 sees."""
    return _slice(x, len(x.shape) - 2, 0, stop)


def _band_probabilities(q_band, key, first, stop, groups, scale, dtype):
    """softmax(q_band @ k[:stop]^T * scale) under the causal mask of rows that start at query first,
    in dtype: (..., H, G * rows, stop)."""
    op = "scaled_dot_product_attention"
    scores = _C._matmul(q_band, _keys_to(key, stop), transpose_b=True, alpha=scale, dtype=_acc(dtype), op=op)
    if groups > 1:  # each query head's rows: the causal mask counts them from first
        scores = reshape(scores, tuple(key.shape[:-2]) + (groups, stop - first, stop))
    probs = _C._softmax(scores, -1, False, dtype, causal=True, causal_offset=first)
    return probs if groups == 1 else reshape(probs, tuple(key.shape[:-2]) + (groups * (stop - first), stop))


def _by_heads(bands, query, key, groups):
    """The bands' rows (each (..., H, G * rows, E') or (..., rows, E')) joined into (..., G * H, L, E')."""
    if groups == 1:
        return cat(bands, len(bands[0].shape) - 2)
    split = [reshape(b, tuple(key.shape[:-2]) + (groups, -1, b.shape[-1])) for b in bands]  # (..., H, G, rows, E')
    joined = cat(split, len(split[0].shape) - 2)
    return reshape(joined, tuple(query.shape[:-1]) + (joined.shape[-1],))


def banded_forward(query, key, value, bands, scale=None, enable_gqa=False):
    """The causal attention's output, composed band by band (causal_bands' bands)."""
    dtype = floating_dtype("scaled_dot_product_attention", "query", query)
    groups, scale = _groups(query, key, enable_gqa), _scale(query, scale)
    outs = []
    for first, stop in bands:
        probs = _band_probabilities(_query_rows(query, key, groups, first, stop), key, first, stop, groups, scale,
                                    dtype)
        outs.append(_C._matmul(probs, _keys_to(value, stop), op="scaled_dot_product_attention"))
    return _by_heads(outs, query, key, groups)


def _band_sum(total, partial, stop):
    """total (float32, (..., S, E)) with partial (keys 0..stop) added to its first stop rows."""
    if total is None:
        return partial
    rows = len(total.shape) - 2
    head = _C._ew(_OPS["add"], _slice(total, rows, 0, stop), partial, dtype=total.dtype)
    return cat([head, _slice(total, rows, stop, total.shape[-2])], rows)


def banded_backward(grad_output, query, key, value, bands, scale=None, enable_gqa=False):
    """(grad_query, grad_key, grad_value) of banded_forward: each band's probabilities recomputed
    (the same bits), its rows' query gradient, and its keys' and values' gradients summed over the
    bands in float32 (the last band first: it sees every key), rounded once to the inputs' dtype."""
    dtype = floating_dtype("scaled_dot_product_attention_backward", "query", query)
    groups, scale = _groups(query, key, enable_gqa), _scale(query, scale)
    grad_queries, grad_key, grad_value = [], None, None
    for first, stop in reversed(bands):
        q_band = _query_rows(query, key, groups, first, stop)
        probs = _band_probabilities(q_band, key, first, stop, groups, scale, dtype)
        # a band's rows against its keys: one head of the composed backward (heads already grouped)
        band_grads = backward_with_scores(_query_rows(grad_output, key, groups, first, stop), q_band,
                                          _keys_to(key, stop), _keys_to(value, stop), probs, scale=scale,
                                          kv_dtype=_acc(dtype))
        grad_queries.append(band_grads[0])
        grad_key = _band_sum(grad_key, band_grads[1], stop)
        grad_value = _band_sum(grad_value, band_grads[2], stop)
    grad_query = _by_heads(grad_queries[::-1], query, key, groups)
    return grad_query, _C._ew(_OPS["copy"], grad_key, dtype=dtype), _C._ew(_OPS["copy"], grad_value, dtype=dtype)


@autocast_op(name="scaled_dot_product_attention")
def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention: softmax(q @ k^T * scale + mask) @ v over
    (..., L, E) queries, (..., S, E) keys and (..., S, Ev) values; is_causal lets query i see keys
    0..i; attn_mask is boolean (True: attend) or added to the scores."""
    return forward_for_backward(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)[0]


def forward_for_backward(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                         enable_gqa=False):
    """(output, state): the fused kernels' output and their Fused, or the composed output and its
    dropout's (seed, offset) (the backward recomputes the probabilities). The dropout mask is
    drawn first, so either path drops the same elements."""
    state = draw_dropout(query, key, dropout_p)
    fused = fused_forward(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, state)
    if fused is not None:
        return fused
    bands = causal_bands(query, key, attn_mask, dropout_p, is_causal)
    if bands is not None:
        _check(query, key, value, attn_mask, is_causal, enable_gqa)
        return banded_forward(query, key, value, bands, scale, enable_gqa), None
    out, _, state = _forward(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, state)
    return out, state


def scaled_dot_product_attention_backward(grad_output, query, key, value, probs, dropout_p=0.0, scale=None,
                                          dropout_state=None):
    """(grad_query, grad_key, grad_value) from the forward's probs and dropout_state (_forward);
    in the inputs' dtype, each product accumulated in float32. Grouped queries (more query heads
    than key heads) are read off the shapes."""
    return backward_with_scores(grad_output, query, key, value, probs, dropout_p, scale, dropout_state)[:3]


def backward_with_scores(grad_output, query, key, value, probs, dropout_p=0.0, scale=None, dropout_state=None,
                         kv_dtype=None):
    """scaled_dot_product_attention_backward's gradients and the scores' (q @ k^T * scale + mask),
    shaped (..., query heads, L, S): an additive mask's gradient is theirs, summed over the
    dimensions it was broadcast along. kv_dtype: the key and value gradients' (the inputs' unless
    given: banded_backward sums its bands' in float32)."""
    scale = _scale(query, scale)
    dtype = floating_dtype("scaled_dot_product_attention_backward", "query", query)
    grouped = tuple(query.shape[:-2]) != tuple(key.shape[:-2])
    q, g = query, grad_output
    if grouped:
        rows = tuple(key.shape[:-2]) + (probs.shape[-2],)
        q = reshape(query, rows + (query.shape[-1],))
        g = reshape(grad_output, rows + (grad_output.shape[-1],))
    attended = probs if dropout_state is None else _C._dropout(probs, float(dropout_p), *dropout_state)
    op = "scaled_dot_product_attention_backward"
    grad_value = _C._matmul(attended, g, transpose_a=True, dtype=kv_dtype, op=op)
    grad_attended = _C._matmul(g, value, transpose_b=True, dtype=_acc(dtype), op=op)
    grad_probs = dropout_backward(grad_attended, dropout_state, dropout_p)
    grad_scores = _C._softmax_backward(grad_probs, probs, -1, False, dtype)
    grad_query = _C._matmul(grad_scores, key, alpha=scale, op=op)
    grad_key = _C._matmul(grad_scores, q, transpose_a=True, alpha=scale, dtype=kv_dtype, op=op)
    if grouped:
        grad_query = reshape(grad_query, tuple(query.shape))
        grad_scores = reshape(grad_scores, tuple(query.shape[:-1]) + (key.shape[-2],))
    return grad_query, grad_key, grad_value, grad_scores
