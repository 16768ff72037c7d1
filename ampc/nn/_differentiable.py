"""Each op of ampc.nn.functional on ampc.autograd's tape: which arguments carry gradients, what its
forward keeps, and which backward kernel turns the output's gradient into theirs.

OPS holds these versions of the ops, built from the bare ones (_bare_ops and the modules of
their own: _attention, _embedding, _shape_ops, _spatial); ampc.nn.functional publishes them in
place of the bare ones. With plain arrays (or under no_grad) they run the bare op unchanged; with
an argument that needs a gradient they return an ampc.autograd.Tensor. A forward here runs on its
arguments as autocast already cast them, so it calls the op's body (``raw``), not the op again.
The backward functions here get plain arrays, so they call the bare ops.
"""

import numbers

import numpy as np

from ampc import _C
from ampc._interop import array_namespace
from ampc.autograd import differentiable
from ampc.nn import _attention, _embedding, _shape_ops, _spatial
from ampc.nn import _bare_ops as bare
from ampc.nn._common import PUBLISHED_IN, acc_dtype, dtype_of, ew


def raw(op):
    """The body of an autocast op (its arguments already cast), or a plain function itself."""
    return getattr(op, "__wrapped__", op)


def _unbroadcast(grad, like):
    # a number (2.0) needs no gradient; a NumPy scalar (np.float64 is a float too) has a shape and one
    return None if getattr(like, "shape", None) is None else bare.unbroadcast(grad, tuple(like.shape))


def _plain_forward(op):
    body = raw(op)
    return lambda a: (body(**a), None)


# -- matrix products and convolutions ---------------------------------------------------------

def _linear_backward(a, saved, g, needs):
    bias = a["bias"]
    return bare.linear_backward(g, a["input"], a["weight"], input_grad=needs[0], weight_grad=needs[1],
                                bias_grad=needs[2], bias_shape=None if bias is None else tuple(bias.shape))


def _matmul_backward(a, saved, g, needs):
    first, second = list(a)[:2]  # input and other (matmul) or mat2 (mm, bmm), in the op's order
    return bare.matmul_backward(g, a[first], a[second])


def _conv_backward(backward):
    def run(a, saved, g, needs):
        return backward(g, a["input"], a["weight"], a["stride"], a["padding"], a["dilation"], a["groups"],
                        input_grad=needs[0], weight_grad=needs[1], bias_grad=needs[2])
    return run


# -- softmax, norms, losses -------------------------------------------------------------------

def _softmax(log):
    body = raw(bare.log_softmax if log else bare.softmax)
    backward = bare.log_softmax_backward if log else bare.softmax_backward

    def forward(a):
        out = body(**a)
        return out, out

    def grad(a, out, g, needs):
        x = a["input"]
        return (backward(g, out, bare.softmax_dim("softmax", x, a["dim"]), x.dtype),)
    return forward, grad


def _layer_norm_forward(a):
    y, mean, rstd = bare.layer_norm_forward(a["input"], a["normalized_shape"], a["weight"], a["bias"], a["eps"])
    return y, (mean, rstd)


def _layer_norm_backward(a, saved, g, needs):
    return bare.layer_norm_backward(g, a["input"], a["normalized_shape"], a["weight"], a["bias"], a["eps"],
                                    mean=saved[0], rstd=saved[1], weight_grads=needs[1] or needs[2])


def _group_norm_forward(a):
    y, mean, rstd = bare.group_norm_forward(a["input"], a["num_groups"], a["weight"], a["bias"], a["eps"])
    return y, (mean, rstd)


def _group_norm_backward(a, saved, g, needs):
    return bare.group_norm_backward(g, a["input"], a["num_groups"], a["weight"], a["bias"], a["eps"],
                                    mean=saved[0], rstd=saved[1], weight_grads=needs[1] or needs[2])


def _batch_norm_forward(a):
    y, mean, rstd = _spatial.batch_norm_forward(a["input"], a["running_mean"], a["running_var"], a["weight"],
                                                a["bias"], a["training"], a["momentum"], a["eps"])
    return y, (mean, rstd)


def _batch_norm_backward(a, saved, g, needs):
    return _spatial.batch_norm_backward(g, a["input"], a["weight"], a["running_mean"], a["running_var"],
                                        a["training"], a["eps"], save_mean=saved[0], save_rstd=saved[1],
                                        input_grad=needs[0], weight_grads=needs[1] or needs[2])


def _reduction(a):
    return bare.legacy_reduction(a["size_average"], a["reduce"], a["reduction"])


def _cross_entropy_forward(a):
    loss, lse, denom = bare.cross_entropy_forward(a["input"], a["target"], a["weight"], a["ignore_index"],
                                                  _reduction(a), a["label_smoothing"])
    return loss, (lse, denom)


def _cross_entropy_backward(a, saved, g, needs):
    grad_input = bare.cross_entropy_backward(g, a["input"], a["target"], a["weight"], a["ignore_index"],
                                             _reduction(a), a["label_smoothing"], lse=saved[0],
                                             denom=saved[1]) if needs[0] else None
    grad_target = bare.cross_entropy_target_grad(g, a["input"], a["target"], a["weight"], _reduction(a),
                                                 a["label_smoothing"]) if needs[1] else None
    return grad_input, grad_target


def _nll_loss_backward(a, saved, g, needs):
    return (bare.nll_loss_backward(g, a["input"], a["target"], a["weight"], a["ignore_index"], _reduction(a)),)


def _pointwise_loss_backward(backward):
    def run(a, saved, g, needs):
        gi = backward(g, a["input"], a["target"], _reduction(a))
        return gi, (bare.mul(gi, -1.0) if needs[1] else None)
    return run


def _bce_backward(a, saved, g, needs):
    grad_input = bare.binary_cross_entropy_backward(g, a["input"], a["target"], a["weight"], _reduction(a)) \
        if needs[0] else None
    grad_target = bare.bce_target_grad("bce", "binary_cross_entropy_backward", g, a["input"], a["target"],
                                       a["weight"], _reduction(a)) if needs[1] else None
    return grad_input, grad_target


def _bce_logits_backward(a, saved, g, needs):
    grad_input = bare.binary_cross_entropy_with_logits_backward(g, a["input"], a["target"], a["weight"],
                                                                _reduction(a), a["pos_weight"]) if needs[0] else None
    grad_target = bare.bce_target_grad("bce_logits", "binary_cross_entropy_with_logits_backward", g, a["input"],
                                       a["target"], a["weight"], _reduction(a), a["pos_weight"]) if needs[1] else None
    return grad_input, grad_target


# -- reductions, pointwise maths --------------------------------------------------------------

def _sum_backward(a, saved, g, needs):
    return (bare.sum_backward(g, tuple(a["input"].shape), a["dim"], a["keepdim"]),)


def _mean_backward(a, saved, g, needs):
    return (bare.mean_backward(g, tuple(a["input"].shape), a["dim"], a["keepdim"]),)


def _keeping_output(op):
    body = raw(op)

    def forward(a):
        out = body(**a)
        return out, out
    return forward


def _derivative_times(g, out, derivative):
    """g * derivative(out), derivative's steps in the accumulation dtype, rounded once to g's."""
    acc = acc_dtype(dtype_of(out))
    return (ew("mul", g, derivative(out, acc), dtype=dtype_of(g)),)


def _sigmoid_backward(a, out, g, needs):  # s (1 - s)
    return _derivative_times(g, out, lambda s, acc: ew("mul", s, ew("add", ew("mul", s, -1.0, dtype=acc), 1.0,
                                                                    dtype=acc), dtype=acc))


def _tanh_backward(a, out, g, needs):  # 1 - t^2
    return _derivative_times(g, out, lambda t, acc: ew("add", ew("mul", t, t, scale=-1.0, dtype=acc), 1.0, dtype=acc))


def _addmm_backward(a, saved, g, needs):
    """beta * input + alpha * mat1 @ mat2 (batch1 @ batch2 for baddbmm)."""
    first, second = ("mat1", "mat2") if "mat1" in a else ("batch1", "batch2")
    alpha, beta = float(a["alpha"]), float(a["beta"])
    g_in = _unbroadcast(g if beta == 1 else bare.mul(g, beta), a["input"]) if needs[0] else None
    g_scaled = g if alpha == 1 else bare.mul(g, alpha)
    g1, g2 = bare.matmul_backward(g_scaled, a[first], a[second]) if needs[1] or needs[2] else (None, None)
    return g_in, g1, g2


def _pow_backward(a, saved, g, needs):
    x, exponent = a["input"], a["exponent"]
    return (_unbroadcast(bare.pow_backward(g, x, exponent), x) if needs[0] else None,
            _unbroadcast(bare.pow_exponent_backward(g, x, exponent), exponent) if needs[1] else None)


class _Shape:
    """What the tape keeps of an argument whose backward needs its shape alone (add's, sub's): the
    array itself would stay alive until backward for nothing."""

    __slots__ = ("shape",)

    def __init__(self, shape):
        self.shape = tuple(shape)


def _keeping_shapes(op, names):
    body = raw(op)

    def forward(a):
        out = body(**a)
        for n in names:
            if a[n] is not None and not isinstance(a[n], (int, float)):
                a[n] = _Shape(a[n].shape)
        return out, None
    return forward


def _relu_forward(a):
    """relu's backward reads its output (positive exactly where the input was; NaN in neither), as
    torch's does: the input, often a batch norm's output nothing else keeps, is let go."""
    out = raw(bare.relu)(**a)
    a["input"] = None
    return out, out


def _unary_backward(backward, *extra):
    def run(a, saved, g, needs):
        return (backward(g, a["input"], *(a[name] for name in extra)),)
    return run


def _dropout_forward(a):
    return _embedding.dropout_forward(a["input"], a["p"], a["training"])


def _add_backward(sign):
    def run(a, saved, g, needs):
        x, other = a["input"], a["other"]
        go = None
        if needs[1]:
            go = _unbroadcast(g if sign * a["alpha"] == 1 else bare.mul(g, float(sign * a["alpha"])), other)
        return (_unbroadcast(g, x) if needs[0] else None), go
    return run


def _mul_backward(a, saved, g, needs):
    x, other = a["input"], a["other"]
    return (_unbroadcast(bare.mul(g, other), x) if needs[0] else None,
            _unbroadcast(bare.mul(g, x), other) if needs[1] else None)


def _div_backward(a, saved, g, needs):
    x, other = a["input"], a["other"]
    gi = bare.div(g, other)
    go = None
    if needs[1]:  # -g * x / other^2
        go = _unbroadcast(bare.mul(bare.div(bare.mul(gi, x), other), -1.0), other)
    return (_unbroadcast(gi, x) if needs[0] else None), go


# -- pools, embedding, attention, shape ops ---------------------------------------------------

def _max_pool_forward(a):
    y, indices = _spatial.max_pool2d_with_indices(a["input"], a["kernel_size"], a["stride"], a["padding"],
                                                  a["dilation"], a["ceil_mode"])
    return ((y, indices) if a["return_indices"] else y), indices


def _max_pool_backward(a, indices, g, needs):
    if isinstance(g, list):
        g = g[0]
    return (_spatial.max_pool2d_backward(g, a["input"], indices, a["kernel_size"], a["stride"], a["padding"],
                                         a["dilation"], a["ceil_mode"]),)


def _avg_pool_backward(a, saved, g, needs):
    return (_spatial.avg_pool2d_backward(g, a["input"], a["kernel_size"], a["stride"], a["padding"], a["ceil_mode"],
                                         a["count_include_pad"], a["divisor_override"]),)


def _embedding_backward(a, saved, g, needs):
    return (_embedding.embedding_backward(g, a["input"], a["weight"].shape[0], a["padding_idx"],
                                          a["scale_grad_by_freq"]),)


def _attention_forward(a):
    return _attention.forward_for_backward(a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"],
                                           a["is_causal"], a["scale"], a["enable_gqa"])


def _attention_backward(a, state, g, needs):
    if isinstance(state, _attention.Fused):  # no mask: the fused kernels take none
        grads = _attention.fused_backward(g, a["query"], a["key"], a["value"], state, a["is_causal"], a["scale"])
        if grads is not None:
            return grads + (None,)
        state = state.dropout_state  # composed: the same mask, from its (seed, offset)
    bands = _attention.causal_bands(a["query"], a["key"], a["attn_mask"], a["dropout_p"], a["is_causal"])
    if bands is not None:
        return _attention.banded_backward(g, a["query"], a["key"], a["value"], bands, a["scale"],
                                          a["enable_gqa"]) + (None,)
    probs = _attention.probabilities(a["query"], a["key"], a["attn_mask"], a["is_causal"], a["scale"], a["enable_gqa"])
    *grads, grad_scores = _attention.backward_with_scores(g, a["query"], a["key"], a["value"], probs, a["dropout_p"],
                                                          a["scale"], state)
    # an additive mask that is learned (T5's, Swin's relative position biases); the tape casts the
    # gradient to the mask's dtype, as every gradient to its input's
    grad_mask = bare.unbroadcast(grad_scores, tuple(a["attn_mask"].shape)) if needs[3] else None
    return (*grads, grad_mask)


def _to_shape_of_input(a, saved, g, needs):
    return (_shape_ops.reshape_backward(g, tuple(a["input"].shape)),)


def _transpose_backward(a, saved, g, needs):
    return (_shape_ops.transpose_backward(g, a["dim0"], a["dim1"]),)


def _permute_backward(a, saved, g, needs):
    return (_shape_ops.permute_backward(g, a["dims"]),)


def _pieces_backward(dim_name):
    def run(a, shapes, grads, needs):
        x = a[dim_name[0]]
        pieces = [g if g is not None else _C.zeros_like(x, shape=shape) for g, shape in zip(grads, shapes)]
        return (_shape_ops.cat(pieces, a[dim_name[1]]),)
    return run


def _pieces_forward(op):
    body = raw(op)

    def forward(a):
        out = tuple(body(**a))
        return out, [tuple(o.shape) for o in out]
    return forward


def _cat_backward(a, saved, g, needs):
    sizes = [t.shape[_shape_ops.wrap_dim("cat", a["dim"], len(t.shape))] for t in a["tensors"]]
    return tuple(_shape_ops.cat_backward(g, sizes, a["dim"]))


def _stack_backward(a, saved, g, needs):
    return tuple(_shape_ops.stack_backward(g, len(a["tensors"]), a["dim"]))


def cast(input, dtype):
    """input in dtype (ampc.cast): on the tape, its gradient comes back in input's dtype."""
    return _C.cast(input, dtype)


def _is_basic(key):
    """Whether key picks a view (ints, slices, None, ...), not elements by index arrays or masks."""
    parts = key if isinstance(key, tuple) else (key,)
    return all(part is None or part is Ellipsis or isinstance(part, slice)
               or (isinstance(part, numbers.Integral) and not isinstance(part, bool)) for part in parts)


def index(input, key):
    """input[key]: ints and slices (a view where the library makes one), index arrays and masks (a
    copy), as the array's library reads them."""
    lib = array_namespace(input)
    if hasattr(lib, "take_slice"):
        return lib.getitem(input, key)
    if isinstance(input, np.ndarray) and _is_basic(key):
        # x[1, 2] is a NumPy scalar, x[1, 2, ...] a 0-d view: the backward writes its gradient there
        key = key if isinstance(key, tuple) else (key,)
        if not any(part is Ellipsis for part in key):
            key += (Ellipsis,)
    return input[key]


def _index_backward(a, saved, g, needs):
    """A zero gradient of input's shape with g where input[key] was taken: written into the view of
    a basic key, added at the indices of an advanced one (an index taken twice gets both, as torch's
    index backward; summed in float32, float64 for float64, and rounded once)."""
    x, key = a["input"], a["key"]
    out = _C.zeros_like(x, dtype=_C.as_dtype(g.dtype), shape=tuple(x.shape))
    if _is_basic(key):
        _C.cast(g, out=index(out, key))
        return (out,)
    if not isinstance(out, np.ndarray):
        raise NotImplementedError("the gradient of indexing by index arrays or masks is implemented for NumPy "
                                  f"arrays only, not {type(out).__name__}; index with ints and slices")
    acc = np.float64 if out.dtype == np.float64 else np.float32
    total = np.zeros(out.shape, acc)
    np.add.at(total, key, np.asarray(g).astype(acc))
    _C.cast(total, out=out)
    return (out,)


def _ops():
    sp = _spatial
    return {
        "linear": differentiable(bare.linear, ("input", "weight", "bias"), _plain_forward(bare.linear),
                                 _linear_backward),
        "matmul": differentiable(bare.matmul, ("input", "other"), _plain_forward(bare.matmul), _matmul_backward),
        "mm": differentiable(bare.mm, ("input", "mat2"), _plain_forward(bare.mm), _matmul_backward),
        "bmm": differentiable(bare.bmm, ("input", "mat2"), _plain_forward(bare.bmm), _matmul_backward),
        "conv2d": differentiable(sp.conv2d, ("input", "weight", "bias"), _plain_forward(sp.conv2d),
                                 _conv_backward(sp.conv2d_backward)),
        "conv1d": differentiable(sp.conv1d, ("input", "weight", "bias"), _plain_forward(sp.conv1d),
                                 _conv_backward(sp.conv1d_backward)),
        "softmax": differentiable(bare.softmax, ("input",), *_softmax(False)),
        "log_softmax": differentiable(bare.log_softmax, ("input",), *_softmax(True)),
        "layer_norm": differentiable(bare.layer_norm, ("input", "weight", "bias"), _layer_norm_forward,
                                     _layer_norm_backward),
        "group_norm": differentiable(bare.group_norm, ("input", "weight", "bias"), _group_norm_forward,
                                     _group_norm_backward),
        "batch_norm": differentiable(sp.batch_norm, ("input", "weight", "bias"), _batch_norm_forward,
                                     _batch_norm_backward),
        "cross_entropy": differentiable(bare.cross_entropy, ("input", "target"), _cross_entropy_forward,
                                        _cross_entropy_backward,
                                        keep_uncast=("input",)),
        "nll_loss": differentiable(bare.nll_loss, ("input",), _plain_forward(bare.nll_loss), _nll_loss_backward),
        "mse_loss": differentiable(bare.mse_loss, ("input", "target"), _plain_forward(bare.mse_loss),
                                   _pointwise_loss_backward(bare.mse_loss_backward)),
        "l1_loss": differentiable(bare.l1_loss, ("input", "target"), _plain_forward(bare.l1_loss),
                                  _pointwise_loss_backward(bare.l1_loss_backward)),
        "binary_cross_entropy_with_logits": differentiable(
            bare.binary_cross_entropy_with_logits, ("input", "target"),
            _plain_forward(bare.binary_cross_entropy_with_logits), _bce_logits_backward),
        "sum": differentiable(bare.sum, ("input",), _plain_forward(bare.sum), _sum_backward),
        "mean": differentiable(bare.mean, ("input",), _plain_forward(bare.mean), _mean_backward),
        "exp": differentiable(bare.exp, ("input",), _keeping_output(bare.exp),
                              lambda a, out, g, n: (bare.exp_backward(g, out),)),
        "sqrt": differentiable(bare.sqrt, ("input",), _keeping_output(bare.sqrt),
                               lambda a, out, g, n: (bare.sqrt_backward(g, out),)),
        "rsqrt": differentiable(bare.rsqrt, ("input",), _keeping_output(bare.rsqrt),
                                lambda a, out, g, n: (bare.rsqrt_backward(g, out),)),
        "pow": differentiable(bare.pow, ("input", "exponent"), _plain_forward(bare.pow), _pow_backward),
        "relu": differentiable(bare.relu, ("input",), _relu_forward,
                               lambda a, out, g, n: (bare.relu_backward(g, out),)),
        **{name: differentiable(forward, ("input",), _plain_forward(forward), _unary_backward(backward, *arguments))
           for name, (forward, backward, arguments) in bare.GRADIENT_AT_INPUT.items()},
        "dropout": differentiable(_embedding.dropout, ("input",), _dropout_forward,
                                  lambda a, state, g, n: (_embedding.dropout_backward(g, state, a["p"]),)),
        "add": differentiable(bare.add, ("input", "other"), _keeping_shapes(bare.add, ("input", "other")),
                              _add_backward(1)),
        "sub": differentiable(bare.sub, ("input", "other"), _keeping_shapes(bare.sub, ("input", "other")),
                              _add_backward(-1)),
        "mul": differentiable(bare.mul, ("input", "other"), _plain_forward(bare.mul), _mul_backward),
        "div": differentiable(bare.div, ("input", "other"), _plain_forward(bare.div), _div_backward),
        "max_pool2d": differentiable(sp.max_pool2d, ("input",), _max_pool_forward, _max_pool_backward),
        "avg_pool2d": differentiable(sp.avg_pool2d, ("input",), _plain_forward(sp.avg_pool2d), _avg_pool_backward),
        "adaptive_avg_pool2d": differentiable(
            sp.adaptive_avg_pool2d, ("input",), _plain_forward(sp.adaptive_avg_pool2d),
            lambda a, s, g, n: (sp.adaptive_avg_pool2d_backward(g, a["input"], a["output_size"]),)),
        "embedding": differentiable(_embedding.embedding, ("weight",), _plain_forward(_embedding.embedding),
                                    _embedding_backward),
        "scaled_dot_product_attention": differentiable(
            _attention.scaled_dot_product_attention, ("query", "key", "value", "attn_mask"), _attention_forward,
            _attention_backward),
        "reshape": differentiable(_shape_ops.reshape, ("input",), _plain_forward(_shape_ops.reshape),
                                  _to_shape_of_input),
        "flatten": differentiable(_shape_ops.flatten, ("input",), _plain_forward(_shape_ops.flatten),
                                  _to_shape_of_input),
        "unsqueeze": differentiable(_shape_ops.unsqueeze, ("input",), _plain_forward(_shape_ops.unsqueeze),
                                    _to_shape_of_input),
        "squeeze": differentiable(_shape_ops.squeeze, ("input",), _plain_forward(_shape_ops.squeeze),
                                  _to_shape_of_input),
        "transpose": differentiable(_shape_ops.transpose, ("input",), _plain_forward(_shape_ops.transpose),
                                    _transpose_backward),
        "permute": differentiable(_shape_ops.permute, ("input",), _plain_forward(_shape_ops.permute),
                                  _permute_backward),
        "cat": differentiable(_shape_ops.cat, ("tensors",), _plain_forward(_shape_ops.cat), _cat_backward),
        "stack": differentiable(_shape_ops.stack, ("tensors",), _plain_forward(_shape_ops.stack), _stack_backward),
        "sigmoid": differentiable(bare.sigmoid, ("input",), _keeping_output(bare.sigmoid), _sigmoid_backward),
        "tanh": differentiable(bare.tanh, ("input",), _keeping_output(bare.tanh), _tanh_backward),
        "addmm": differentiable(bare.addmm, ("input", "mat1", "mat2"), _plain_forward(bare.addmm), _addmm_backward),
        "baddbmm": differentiable(bare.baddbmm, ("input", "batch1", "batch2"), _plain_forward(bare.baddbmm),
                                  _addmm_backward),
        "binary_cross_entropy": differentiable(bare.binary_cross_entropy, ("input", "target"),
                                               _plain_forward(bare.binary_cross_entropy), _bce_backward),
        "max_pool2d_with_indices": differentiable(
            sp.max_pool2d_with_indices, ("input",),
            lambda a: _max_pool_forward({**a, "return_indices": True}), _max_pool_backward),
        "_cast": differentiable(cast, ("input",), _plain_forward(cast), lambda a, s, g, n: (g,)),  # Tensor.to
        "_index": differentiable(index, ("input",), _plain_forward(index), _index_backward),  # Tensor[key]
        "split": differentiable(_shape_ops.split, ("tensor",), _pieces_forward(_shape_ops.split),
                                _pieces_backward(("tensor", "dim"))),
        "chunk": differentiable(_shape_ops.chunk, ("input",), _pieces_forward(_shape_ops.chunk),
                                _pieces_backward(("input", "dim"))),
    }


OPS = _ops()
for _name, _op in OPS.items():  # as ampc.nn.functional.<name>, where help() and pickle look them up
    if not _name.startswith("_"):  # Tensor.to's and Tensor[key]'s are not published
        _op.__module__, _op.__qualname__ = PUBLISHED_IN, _name
del _name, _op
