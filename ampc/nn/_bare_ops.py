"""The ops of ampc.nn.functional that have no module of their own (_attention, _embedding,
_shape_ops and _spatial hold the others), bare, that is without ampc.autograd's tape: the matrix
products, softmax and the norms, the losses, the reductions and the pointwise maths, each with its
backward.

ampc.nn.functional publishes them: each forward op as _differentiable.py puts it on the tape,
each *_backward function as it is here. So that help(), repr() and pickle name them there, each
public op here carries functional's name as its __module__ (as NumPy's set_module does). The
other names without an underscore (the *_forward functions that also return what a backward
needs, the target gradients, unbroadcast, softmax_dim, legacy_reduction) are what
_differentiable.py and modules.py use; they are not published.
"""

import math
import numbers

import numpy as np

from ampc import _C
from ampc._C import as_dtype
from ampc._arguments import as_int as _as_int, as_ints as _as_ints, names_non_arrays as _names_non_arrays
from ampc.amp import autocast_op
from ampc.nn._common import F32, OPS as _OPS, PUBLISHED_IN as _PUBLISHED_IN, acc_dtype as _acc
from ampc.nn._common import cast_for_dtype as _cast_for_dtype, dtype_of as _dtype, ew as _ew
from ampc.nn._common import floating_dtype as _floating_dtype, in_place as _in_place, numel as _numel
from ampc.nn._common import is_floating_array as _is_floating_array
from ampc.nn._common import is_number as _is_number, result_type as _result_type, shape_of as _shape_of
from ampc.nn._shape_ops import reshape as _bare_reshape, wrap_dim

_REDUCTIONS = ("none", "mean", "sum")


def _op(fn):
    """fn, a public op of ampc.nn.functional, under that module's name: functional re-exports it
    (or the tape's version of it, which takes its name, text and module from fn)."""
    fn.__module__ = _PUBLISHED_IN
    return fn


def _backward_op(fn):
    """fn, a public op that is not on the tape (a *_backward function): _op, and an argument that
    is no array gets the TypeError that names it (the tape's ops name it in autograd's call)."""
    return _names_non_arrays(_op(fn))


# The pointwise ops whose gradient needs only the incoming gradient, the input and the forward's
# arguments named here: name -> (forward, backward, those arguments). The tape builds their entries
# from it (_differentiable), so such an op is written once, in this file.
GRADIENT_AT_INPUT = {}


def _gradient_of(forward, *arguments):
    """Decorates forward's backward(grad_output, input, *arguments): the pair goes on the tape."""
    def record(backward):
        GRADIENT_AT_INPUT[forward.__name__] = (forward, backward, arguments)
        return backward
    return record


def _check_reduction(op, reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: {reduction} is not a valid value for reduction")


def _reshape(x, shape):
    return _bare_reshape(x, shape)


def _reduce(op, loss, reduction, dtype):
    """Apply a loss's reduction to its per-element values (computed in the accumulation dtype)."""
    if reduction == "none":
        return loss if _dtype(loss) == dtype else _C._ew(_OPS["copy"], loss, dtype=dtype)
    n = _numel(loss)
    scale = 1.0 / n if reduction == "mean" and n > 0 else (math.nan if reduction == "mean" else 1.0)
    return _C._sum(loss, None, False, scale, dtype=dtype)


def _reduction_grad(grad_output, shape, reduction):
    """The factor the gradient of each element of a reduced loss carries: grad_output (broadcast)
    times 1/n for a mean."""
    if reduction == "mean":
        n = math.prod(shape)
        return grad_output, (1.0 / n if n > 0 else math.nan)
    return grad_output, 1.0


# --------------------------------------------------------------------------------------------
# Matrix products: lower precision under autocast
# --------------------------------------------------------------------------------------------


@autocast_op(name="linear")
@_op
def linear(input, weight, bias=None):
    """y = input @ weight.T + bias (weight: (out_features, in_features), or (in_features,) for one
    output feature, the dimension dropped, as torch's). bias: any array that broadcasts to y without
    growing it, as torch's: (out_features,), (1, out_features), y's own shape, a 0-d array."""
    if len(_shape_of(weight, "linear", "weight")) == 1:
        b = None if bias is None else _reshape(bias, tuple(_shape_of(bias, "linear", "bias")) + (1,))
        y = linear(input, _reshape(weight, (1, -1)), b)
        return _reshape(y, tuple(y.shape[:-1]))
    return _C._matmul(input, weight, bias=bias, transpose_b=True, op="linear")


@_backward_op
def linear_backward(grad_output, input, weight, *, input_grad=True, weight_grad=True, bias_grad=True,
                    bias_shape=None):
    """(grad_input, grad_weight, grad_bias) of linear; None for the ones not asked for. bias_shape:
    the bias's shape where it is not (out_features,) (0-d for a 1-D weight): its gradient is then
    grad_output summed down to that shape."""
    if len(_shape_of(weight, "linear_backward", "weight")) == 1:  # one output feature, its dimension dropped
        shape = () if bias_shape is None else tuple(bias_shape)
        gi, gw, gb = linear_backward(_reshape(grad_output, tuple(grad_output.shape) + (1,)), input,
                                     _reshape(weight, (1, -1)), input_grad=input_grad, weight_grad=weight_grad,
                                     bias_grad=bias_grad, bias_shape=shape + (1,))
        return gi, None if gw is None else _reshape(gw, (-1,)), None if gb is None else _reshape(gb, shape)
    k = grad_output.shape[-1]
    broadcast_bias = bias_grad and bias_shape is not None and tuple(bias_shape) != (k,)
    gi = _C._matmul(grad_output, weight, op="linear_backward") if input_grad else None
    gw = gb = None
    if weight_grad or (bias_grad and not broadcast_bias):
        g2 = _reshape(grad_output, (-1, k))
        if weight_grad:
            x2 = _reshape(input, (-1, input.shape[-1]))
            # the bias gradient comes with the weight's product (fused on the GPU where cuBLASLt can)
            gw = _C._matmul(g2, x2, transpose_a=True, op="linear_backward", bias_grad=bias_grad and not broadcast_bias)
            if bias_grad and not broadcast_bias:
                gw, gb = gw
        elif bias_grad:
            gb = _C._sum(g2, (0,))
    if broadcast_bias:
        gb = unbroadcast(grad_output, tuple(bias_shape))
        if gb is grad_output:  # the bias had the output's shape: its own array, not the caller's
            gb = _C._ew(_OPS["copy"], grad_output, name="linear_backward", names=("grad_output",))
    return gi, gw, gb


@autocast_op(name="matmul")
@_op
def matmul(input, other):
    """torch.matmul: 1-D operands, broadcast batch dimensions."""
    return _C._matmul(input, other, op="matmul")


def unbroadcast(grad, shape):
    """Sum grad down to `shape` (the inverse of broadcasting it)."""
    extra = len(grad.shape) - len(shape)
    dims = list(range(extra))
    for d, s in enumerate(shape):
        if s == 1 and grad.shape[extra + d] != 1:
            dims.append(extra + d)
    if not dims:
        return grad
    summed = _C._sum(grad, tuple(dims), True)
    return _reshape(summed, shape)


@_backward_op
def matmul_backward(grad_output, input, other):
    """(grad_input, grad_other) of matmul; a 1-D operand counts as a matrix of one row (input)
    or one column (other), as in matmul itself."""
    a_shape, b_shape = tuple(input.shape), tuple(other.shape)
    g_shape = tuple(grad_output.shape)
    if len(a_shape) == 1:
        input = _reshape(input, (1,) + a_shape)
        g_shape = g_shape[:-1] + (1,) + g_shape[-1:] if len(b_shape) > 1 else g_shape + (1,)
    if len(b_shape) == 1:
        other = _reshape(other, b_shape + (1,))
        g_shape = g_shape + (1,)
    grad_output = _reshape(grad_output, g_shape)
    gi = _C._matmul(grad_output, other, transpose_b=True, op="matmul_backward")
    go = _C._matmul(input, grad_output, transpose_a=True, op="matmul_backward")
    gi = unbroadcast(gi, tuple(input.shape))
    go = unbroadcast(go, tuple(other.shape))
    return _reshape(gi, a_shape), _reshape(go, b_shape)


def _check_ndim(op, x, name, ndim):
    if len(x.shape) != ndim:
        raise ValueError(f"{op}: {name} must be a {ndim}-D array, got {len(x.shape)}-D")


@autocast_op(name="mm")
@_op
def mm(input, mat2):
    """The matrix product of two 2-D arrays, as torch.mm; on autocast's lower-precision list."""
    _check_ndim("mm", input, "input", 2)
    _check_ndim("mm", mat2, "mat2", 2)
    return _C._matmul(input, mat2, op="mm")


@autocast_op(name="bmm")
@_op
def bmm(input, mat2):
    """The batched matrix product of two 3-D arrays with the same batch size, as torch.bmm; on autocast's
    lower-precision list."""
    _check_ndim("bmm", input, "input", 3)
    _check_ndim("bmm", mat2, "mat2", 3)
    if input.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm: batch sizes differ: input has {input.shape[0]}, mat2 has {mat2.shape[0]}")
    return _C._matmul(input, mat2, op="bmm")


@autocast_op(name="addmm")
@_op
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * mat1 @ mat2, input broadcast."""
    _check_ndim("addmm", mat1, "mat1", 2)
    _check_ndim("addmm", mat2, "mat2", 2)
    return _C._matmul(mat1, mat2, c=input, alpha=float(alpha), beta=float(beta), op="addmm")


@autocast_op(name="baddbmm")
@_op
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * batch1 @ batch2, input broadcast."""
    _check_ndim("baddbmm", batch1, "batch1", 3)
    _check_ndim("baddbmm", batch2, "batch2", 3)
    return _C._matmul(batch1, batch2, c=input, alpha=float(alpha), beta=float(beta), op="baddbmm")


# --------------------------------------------------------------------------------------------
# softmax and the norms: float32 under autocast
# --------------------------------------------------------------------------------------------


def softmax_dim(op, input, dim):
    if dim is None:
        # torch's legacy choice (with a warning there): 0 for 0-, 1- and 3-D, else 1
        ndim = len(input.shape)
        return 0 if ndim in (0, 1, 3) else 1
    return _as_int(op, "dim", dim)


@autocast_op(name="softmax")
@_op
def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) along dim, as torch.nn.functional.softmax; dtype= computes and answers in that dtype."""
    return _C._softmax(_cast_for_dtype(input, dtype), softmax_dim("softmax", input, dim), False, dtype)


@autocast_op(name="log_softmax")
@_op
def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log(softmax(x)) along dim, computed stably, as torch.nn.functional.log_softmax; on autocast's float32 list."""
    return _C._softmax(_cast_for_dtype(input, dtype), softmax_dim("log_softmax", input, dim), True, dtype)


@_backward_op
def softmax_backward(grad_output, output, dim, input_dtype=None):
    """The gradient of softmax's input from its output; in input_dtype (default output's)."""
    return _C._softmax_backward(grad_output, output, _as_int("softmax_backward", "dim", dim), False, input_dtype)


@_backward_op
def log_softmax_backward(grad_output, output, dim, input_dtype=None):
    """The gradient of log_softmax's input from its output; in input_dtype (default output's)."""
    return _C._softmax_backward(grad_output, output, _as_int("log_softmax_backward", "dim", dim), True, input_dtype)


def _normalized_size(op, input, normalized_shape):
    normalized_shape = _as_ints(op, "normalized_shape", normalized_shape)
    shape = tuple(input.shape)
    if len(normalized_shape) == 0 or shape[len(shape) - len(normalized_shape):] != normalized_shape:
        raise ValueError(f"{op}: Given normalized_shape={list(normalized_shape)}, expected input with shape "
                         f"[*, {', '.join(str(s) for s in normalized_shape)}], but got input of size {list(shape)}")
    return math.prod(normalized_shape)


def layer_norm_forward(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(output, mean, rstd): layer_norm and what its backward needs."""
    n = _normalized_size("layer_norm", input, normalized_shape)
    return _C._layer_norm(input, n, weight, bias, float(eps))


@autocast_op(name="layer_norm")
@_op
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalises over the last dimensions (normalized_shape) to mean 0 and variance 1, then weight * x + bias, as
    torch.nn.functional.layer_norm; on autocast's float32 list."""
    n = _normalized_size("layer_norm", input, normalized_shape)
    return _C._layer_norm(input, n, weight, bias, float(eps), stats=False)  # the tape's forward keeps them


@_backward_op
def layer_norm_backward(grad_output, input, normalized_shape, weight=None, bias=None, eps=1e-5, *, mean=None,
                        rstd=None, weight_grads=True):
    """(grad_input, grad_weight, grad_bias) of layer_norm; mean and rstd as layer_norm_forward saved
    them (recomputed when not given). grad_weight/grad_bias are None without weight/bias."""
    n = _normalized_size("layer_norm_backward", input, normalized_shape)
    if mean is None or rstd is None:
        _, mean, rstd = _C._layer_norm(input, n, None, None, float(eps))
    gi, gw, gb = _C._layer_norm_backward(grad_output, input, mean, rstd, n, weight,
                                         weight_grads and (weight is not None or bias is not None))
    gw = _reshape(gw, tuple(weight.shape)) if weight is not None else None
    gb = _reshape(gb, tuple(bias.shape)) if bias is not None else None
    return gi, gw, gb


def _group_rows(op, input, num_groups):
    """(rows, n, num_groups): input (N, C, *) as its (N * num_groups, n = C / num_groups * prod(*)) rows."""
    shape = tuple(input.shape)
    if len(shape) < 2:
        raise ValueError(f"{op}: Expected at least 2 dimensions for input tensor but received {len(shape)}")
    num_groups = _as_int(op, "num_groups", num_groups)
    if num_groups <= 0 or shape[1] % num_groups != 0:
        raise ValueError(f"{op}: Expected number of channels in input to be divisible by num_groups, but got input "
                         f"of shape {list(shape)} and num_groups={num_groups}")
    n = math.prod(shape[1:]) // num_groups
    return _reshape(input, (shape[0] * num_groups, n)), n, num_groups


def group_norm_forward(input, num_groups, weight=None, bias=None, eps=1e-5):
    """(output, mean, rstd): group_norm, and the statistics of each of the N * num_groups groups."""
    rows, n, groups = _group_rows("group_norm", input, num_groups)
    shape = tuple(input.shape)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and _numel(p) != shape[1]:
            raise ValueError(f"group_norm: Expected {name} to be a vector of size equal to the number of channels in "
                             f"input, but got {name} of shape {list(p.shape)} and input of shape {list(shape)}")
    # the affine step per channel in the normalising pass, in the accumulation dtype: one rounding
    y, mean, rstd = _C._layer_norm(rows, n, weight, bias, float(eps), groups=groups, channels=shape[1])
    return _reshape(y, shape), mean, rstd


@autocast_op(name="group_norm")
@_op
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm over input (N, C, *): the channels in num_groups groups, each
    normalised over its channels and positions; weight and bias per channel."""
    return group_norm_forward(input, num_groups, weight, bias, eps)[0]


@_backward_op
def group_norm_backward(grad_output, input, num_groups, weight=None, bias=None, eps=1e-5, *, mean=None, rstd=None,
                        weight_grads=True):
    """(grad_input, grad_weight, grad_bias) of group_norm; mean and rstd as group_norm_forward
    returned them (recomputed when not given). grad_weight/grad_bias are None without weight/bias."""
    rows, n, groups = _group_rows("group_norm_backward", input, num_groups)
    shape = tuple(input.shape)
    if mean is None or rstd is None:
        _, mean, rstd = _C._layer_norm(rows, n, None, None, float(eps))
    # dx (layer_norm's over the groups, the incoming gradient times the channel's weight) and the weight
    # gradients per channel from the same sums; both in the weight's dtype (the input's without one)
    sums = weight_grads and (weight is not None or bias is not None)
    gi, gw, gb = _C._layer_norm_backward(_reshape(grad_output, tuple(rows.shape)), rows, mean, rstd, n, weight, sums,
                                         groups=groups, channels=shape[1])
    if sums and bias is not None and _dtype(gb) != _dtype(bias):
        gb = _ew("copy", gb, dtype=_dtype(bias))
    return (_reshape(gi, shape), gw if sums and weight is not None else None,
            gb if sums and bias is not None else None)


# --------------------------------------------------------------------------------------------
# Losses: float32 under autocast
# --------------------------------------------------------------------------------------------


def cross_entropy_forward(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                           log_probs=False, stats=True):
    """(loss, lse, denom): the loss, and what its backward needs (the loss alone without stats).
    Probability targets of a wider dtype than input's (float16 logits, float32 targets) give a loss
    of the promoted dtype, as torch's: computed from input's values in it (the gradient stays in
    input's dtype)."""
    op = "nll_loss" if log_probs else "cross_entropy"
    _check_reduction(op, reduction)
    if not log_probs and _is_floating_array(target) and _is_floating_array(input):
        promoted = _result_type(op, (as_dtype(input.dtype), as_dtype(target.dtype)))
        if promoted != as_dtype(input.dtype):
            out = cross_entropy_forward(_C.cast(input, promoted), target, weight, ignore_index, reduction,
                                         label_smoothing, stats=stats)
            if not stats:
                return out
            loss, lse, denom = out
            acc = _acc(as_dtype(input.dtype))  # the backward's, for input's dtype
            return loss, _C.cast(lse, acc), denom if as_dtype(denom.dtype) == acc else _C.cast(denom, acc)
    return _C._cross_entropy(input, target, weight, _as_int(op, "ignore_index", ignore_index), float(label_smoothing),
                             reduction, log_probs, stats)


@autocast_op(name="cross_entropy")
@_op
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """input (N, C, d1, ...) or (C,) logits; target class indices (N, d1, ...) or probabilities."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return cross_entropy_forward(input, target, weight, ignore_index, reduction, label_smoothing, stats=False)


@_backward_op
def cross_entropy_backward(grad_output, input, target, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0, *, lse=None, denom=None):
    """The gradient of cross_entropy with respect to its input (in input's dtype)."""
    ignore_index = _as_int("cross_entropy_backward", "ignore_index", ignore_index)
    if lse is None or denom is None:
        _, lse, denom = cross_entropy_forward(input, target, weight, ignore_index, reduction, label_smoothing)
    return _C._cross_entropy_backward(grad_output, input, target, lse, denom, weight, ignore_index,
                                      float(label_smoothing), reduction, False)


def cross_entropy_target_grad(grad_output, input, target, weight=None, reduction="mean", label_smoothing=0.0):
    """The gradient of cross_entropy with respect to probability targets, in target's dtype:
    -(1 - label_smoothing) * weight[c] * log_softmax(input)[c] times grad_output (each row's for
    'none'; over the rows for 'mean', as torch divides a probability target's loss)."""
    op = "cross_entropy_backward"
    dtype = _floating_dtype(op, "target", target)
    shape = tuple(input.shape)
    class_dim = 1 if len(shape) > 1 else 0
    log_probs = _C._softmax(input, class_dim, True, _acc(dtype))
    rows = _numel(input) // shape[class_dim] if shape[class_dim] else 0
    if reduction == "none" and class_dim == 1:
        grad_output = _bare_reshape(grad_output, shape[:1] + (1,) + shape[2:])
    scale = -(1.0 - float(label_smoothing)) / (rows if reduction == "mean" and rows else 1.0)
    if weight is None:
        return _ew("mul", log_probs, grad_output, scale=scale, dtype=dtype, name=op, names=("input", "grad_output"))
    weight = _bare_reshape(weight, (shape[class_dim],) + (1,) * (len(shape) - class_dim - 1))
    return _ew("mul", log_probs, grad_output, weight, scale=scale, dtype=dtype, name=op,
               names=("input", "grad_output", "weight"))


@autocast_op(name="nll_loss")
@_op
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean"):
    """input (N, C, d1, ...) log-probabilities; target class indices."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return cross_entropy_forward(input, target, weight, ignore_index, reduction, log_probs=True, stats=False)


@_backward_op
def nll_loss_backward(grad_output, input, target, weight=None, ignore_index=-100, reduction="mean"):
    """The gradient of nll_loss with respect to its input, from the loss's gradient, with the forward's arguments."""
    ignore_index = _as_int("nll_loss_backward", "ignore_index", ignore_index)
    _, lse, denom = cross_entropy_forward(input, target, weight, ignore_index, reduction, log_probs=True)
    return _C._cross_entropy_backward(grad_output, input, target, lse, denom, weight, ignore_index, 0.0,
                                      reduction, True)


def legacy_reduction(size_average, reduce, reduction):
    """torch's deprecated size_average/reduce arguments, mapped as torch maps them."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


_LOSS_ARGUMENTS = ("input", "target", "grad_output")
_WEIGHTED_LOSS_ARGUMENTS = ("input", "target", "weight")


def _same_shape_loss_dtype(name, input, target, reduction):
    """A pointwise loss's checks (the reduction, target shaped as input) and its dtype: input's and
    target's promoted."""
    _check_reduction(name, reduction)
    if tuple(input.shape) != tuple(target.shape):
        raise ValueError(f"{name}: target has shape {tuple(target.shape)} but input has shape "
                         f"{tuple(input.shape)}; give them the same shape")
    return _result_type(name, (_floating_dtype(name, "input", input), _floating_dtype(name, "target", target)))


def _pointwise_loss(name, op, input, target, reduction):
    dtype = _same_shape_loss_dtype(name, input, target, reduction)
    per_element = _ew(op, input, target, dtype=_acc(dtype) if reduction != "none" else dtype, name=name,
                      names=_LOSS_ARGUMENTS)
    return _reduce(name, per_element, reduction, dtype)


def _check_grad_output(op, grad_output):
    """For the backward functions that pass grad_output to _ew as its multiplier: the kernel reads a
    missing third operand as 1, so None would give a gradient without a word."""
    if grad_output is None:
        raise TypeError(f"{op}: grad_output must be an array or a number, got None")


def _pointwise_loss_backward(name, op, grad_output, input, target, reduction, scale=1.0):
    _check_reduction(name, reduction)
    _check_grad_output(f"{name}_backward", grad_output)
    dtype = _floating_dtype(f"{name}_backward", "input", input)
    grad_output, factor = _reduction_grad(grad_output, tuple(input.shape), reduction)
    return _ew(op, input, target, grad_output, scale=factor * scale, dtype=dtype, name=f"{name}_backward",
               names=_LOSS_ARGUMENTS)


@autocast_op(name="mse_loss")
@_op
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """The mean (or sum, or none: reduction) squared difference between input and target, as
    torch.nn.functional.mse_loss; on autocast's float32 list."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    return _pointwise_loss("mse_loss", "squared_diff", input, target, reduction)


@_backward_op
def mse_loss_backward(grad_output, input, target, reduction="mean"):
    """The gradient of mse_loss with respect to its input, from the loss's gradient."""
    return _pointwise_loss_backward("mse_loss", "squared_diff_grad", grad_output, input, target, reduction)


@autocast_op(name="l1_loss")
@_op
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """The mean (or sum, or none: reduction) absolute difference between input and target, as
    torch.nn.functional.l1_loss; on autocast's float32 list."""
    return _pointwise_loss("l1_loss", "abs_diff", input, target, legacy_reduction(size_average, reduce, reduction))


@_backward_op
def l1_loss_backward(grad_output, input, target, reduction="mean"):
    """The gradient of l1_loss with respect to its input, from the loss's gradient."""
    return _pointwise_loss_backward("l1_loss", "abs_diff_grad", grad_output, input, target, reduction)


def _pos_weight_term(op, kernel, input, target, pos_weight, dtype):
    """What pos_weight p adds to binary_cross_entropy_with_logits's loss, (p - 1) t softplus(-x), or to
    its gradient, (p - 1) t (sigmoid(x) - 1): torch's loss (1 - t) x + (1 + (p - 1) t) softplus(-x) is the
    plain one plus this. kernel(x, 1) is the factor (the plain loss or gradient at target 1); computed
    in dtype (the accumulation dtype)."""
    names = ("input", "target", "pos_weight")
    p_minus_1 = _ew("add", pos_weight, -1.0, dtype=dtype, name=op, names=names[2:])
    factor = _ew(kernel, input, 1.0, dtype=dtype, name=op, names=names[:1])
    return _ew("mul", p_minus_1, target, factor, dtype=dtype, name=op, names=(names[2], names[1], "input"))


@autocast_op(name="binary_cross_entropy_with_logits")
@_op
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None, reduction="mean",
                                     pos_weight=None):
    """Binary cross entropy of sigmoid(input) against target, computed stably from the logits, with optional weight
    and pos_weight, as torch.nn.functional.binary_cross_entropy_with_logits; on autocast's float32 list."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    if weight is None and pos_weight is None:
        return _pointwise_loss("binary_cross_entropy_with_logits", "bce_logits", input, target, reduction)
    op = "binary_cross_entropy_with_logits"
    dtype = _same_shape_loss_dtype(op, input, target, reduction)
    acc = _acc(dtype)
    if pos_weight is None:
        per_element = _ew("bce_logits", input, target, weight, dtype=acc if reduction != "none" else dtype, name=op,
                          names=_WEIGHTED_LOSS_ARGUMENTS)
    else:
        per_element = _ew("add", _ew("bce_logits", input, target, dtype=acc, name=op, names=_LOSS_ARGUMENTS),
                          _pos_weight_term(op, "bce_logits", input, target, pos_weight, acc), dtype=acc, name=op,
                          names=("input", "pos_weight"))
        if weight is not None:
            per_element = _ew("mul", per_element, weight, dtype=acc, name=op, names=("input", "weight"))
    return _reduce(op, per_element, reduction, dtype)


@_backward_op
def binary_cross_entropy_with_logits_backward(grad_output, input, target, weight=None, reduction="mean",
                                              pos_weight=None):
    """The gradient of binary_cross_entropy_with_logits with respect to its input, from the loss's gradient."""
    op = "binary_cross_entropy_with_logits"
    g = _pointwise_loss_backward(op, "bce_logits_grad", grad_output, input, target, reduction)
    if pos_weight is not None:  # the gradient's pos_weight term, times grad_output as the plain one
        dtype = _floating_dtype(f"{op}_backward", "input", input)
        term = _pos_weight_term(f"{op}_backward", "bce_logits_grad", input, target, pos_weight, _acc(dtype))
        grad, factor = _reduction_grad(grad_output, tuple(input.shape), reduction)
        g = _ew("add", g, _ew("mul", term, grad, scale=factor, dtype=_acc(dtype), name=f"{op}_backward",
                                names=("pos_weight", "grad_output")),
                dtype=dtype, name=f"{op}_backward", names=("input", "pos_weight"))
    return g if weight is None else _ew("mul", g, weight, dtype=_dtype(input), name=f"{op}_backward",
                                        names=("input", "weight"))


def bce_target_grad(kernel, op, grad_output, input, target, weight, reduction, pos_weight=None):
    """The gradient of binary_cross_entropy (kernel "bce") or of its _with_logits form ("bce_logits")
    with respect to target, in target's dtype: the loss at target 1 less the loss at target 0 (it is
    linear in the target): log(1 - p) - log(p), logs clamped at -100 as torch's; -x for logits, plus
    (pos_weight - 1) softplus(-x) with a pos_weight. Times grad_output (over the elements for 'mean')
    and weight."""
    dtype = _floating_dtype(op, "target", target)
    acc = _acc(dtype)
    grad, factor = _reduction_grad(grad_output, tuple(input.shape), reduction)
    slope = _ew("add", _ew(kernel, input, 1.0, dtype=acc, name=op), _ew(kernel, input, 0.0, dtype=acc, name=op),
                param=-1.0, dtype=acc, name=op)
    if pos_weight is not None:
        slope = _ew("add", slope, _pos_weight_term(op, kernel, input, 1.0, pos_weight, acc), dtype=acc, name=op)
    slope = _ew("mul", slope, grad, scale=factor, dtype=acc if weight is not None else dtype, name=op,
                names=("input", "grad_output"))
    return slope if weight is None else _ew("mul", slope, weight, dtype=dtype, name=op, names=("input", "weight"))


def _check_probabilities(op, input):
    """torch's CPU check that binary_cross_entropy's input holds probabilities: outside [0, 1] (NaN
    included) the loss is no loss (1.5 gave -log 1.5 < 0). On the GPU torch asserts in the kernel;
    ampc reads no device memory back inside an op, so there the values pass unchecked."""
    if isinstance(input, np.ndarray):
        with np.errstate(invalid="ignore"):
            if not np.all((input >= 0) & (input <= 1)):
                raise RuntimeError(f"{op}: all elements of input should be between 0 and 1")


@autocast_op(name="binary_cross_entropy")
@_op
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean"):
    """Banned under CUDA autocast (torch's text says to use binary_cross_entropy_with_logits);
    float32 under CPU autocast."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    _check_probabilities("binary_cross_entropy", input)
    if weight is None:
        return _pointwise_loss("binary_cross_entropy", "bce", input, target, reduction)
    op = "binary_cross_entropy"
    dtype = _same_shape_loss_dtype(op, input, target, reduction)
    per_element = _ew("bce", input, target, weight, dtype=_acc(dtype) if reduction != "none" else dtype,
                      name="binary_cross_entropy", names=_WEIGHTED_LOSS_ARGUMENTS)
    return _reduce("binary_cross_entropy", per_element, reduction, dtype)


@_backward_op
def binary_cross_entropy_backward(grad_output, input, target, weight=None, reduction="mean"):
    """The gradient of binary_cross_entropy with respect to its input, from the loss's gradient."""
    _check_probabilities("binary_cross_entropy_backward", input)
    g = _pointwise_loss_backward("binary_cross_entropy", "bce_grad", grad_output, input, target, reduction)
    return g if weight is None else _ew("mul", g, weight, dtype=_dtype(input), name="binary_cross_entropy_backward",
                                        names=("input", "weight"))


# --------------------------------------------------------------------------------------------
# Reductions and pointwise maths (float32 under CUDA autocast where torch lists them)
# --------------------------------------------------------------------------------------------


def _dims(dim, op="sum", ndim=None):
    """dim (None, an int or a list or tuple of ints) as a tuple of ints, each checked against ndim
    where given: int() took 1.5 for 1, a silent wrong answer. None or an empty list is every
    dimension, as in torch."""
    if dim is None:
        return None
    dims = _as_ints(op, "dim", dim, "an int or a list or tuple of ints")
    if not dims:
        return None
    for d in dims if ndim is not None else ():
        wrap_dim(op, d, ndim)  # the shape ops' range check and IndexError text
    return dims


@autocast_op(name="sum")
@_op
def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001 - torch's name
    """The sum of input's elements over dim (all of them by default), as torch.sum; on autocast's float32 list."""
    return _C._sum(_cast_for_dtype(input, dtype), _dims(dim), keepdim, 1.0, dtype=dtype)


@_op
def mean(input, dim=None, keepdim=False, *, dtype=None):
    """The mean of input's elements over dim (all of them by default), as torch.mean; keepdim keeps the reduced
    dimensions as size 1."""
    shape = tuple(input.shape)
    dims = _dims(dim, "mean", len(shape))
    count = math.prod(shape) if dims is None else math.prod(shape[d] for d in dims)
    return _C._sum(_cast_for_dtype(input, dtype), dims, keepdim, 1.0 / count if count else math.nan, dtype=dtype,
                   name="mean")


def _sum_gradient(op, grad_output, input_shape, dim, keepdim, scale):
    """grad_output * scale broadcast back to input_shape over the reduced dims: sum's gradient
    (scale 1) and mean's (1/count); op names the caller in messages."""
    input_shape = _as_ints(op, "input_shape", input_shape)
    dims = _dims(dim, op, len(input_shape))
    if dims is None:
        dims = tuple(range(len(input_shape)))
    dims = tuple(d % max(len(input_shape), 1) for d in dims)
    if not keepdim:
        kept = [1 if d in dims else s for d, s in enumerate(input_shape)]
        grad_output = _reshape(grad_output, kept)
    return _C._ew(_OPS["copy"], grad_output, scale=scale, shape=input_shape, name=op, names=("grad_output",))


@_backward_op
def sum_backward(grad_output, input_shape, dim=None, keepdim=False, scale=1.0):
    """The gradient of sum (scale 1) or mean (scale 1/count) over dim: grad_output broadcast
    back to input_shape."""
    return _sum_gradient("sum_backward", grad_output, input_shape, dim, keepdim, scale)


@_backward_op
def mean_backward(grad_output, input_shape, dim=None, keepdim=False):
    """The gradient of mean over dim."""
    shape = _as_ints("mean_backward", "input_shape", input_shape)
    dims = _dims(dim, "mean_backward", len(shape))
    count = math.prod(shape) if dims is None else math.prod(shape[d] for d in dims)
    return _sum_gradient("mean_backward", grad_output, shape, dim, keepdim, 1.0 / count if count else math.nan)


def _gradient_at_input(kernel, op, grad_output, input, param=1.0, param2=0.0):
    """kernel(grad_output, input) in input's dtype: the gradient of pointwise op `op` at its input."""
    return _ew(kernel, grad_output, input, param=param, param2=param2, dtype=_floating_dtype(op, "input", input),
               name=op, names=("grad_output", "input"))


@autocast_op(name="exp")
@_op
def exp(input):
    """e raised to each element, as torch.exp; on autocast's float32 list."""
    return _ew("exp", input)


@autocast_op(name="log")
@_op
def log(input):
    """The natural logarithm of each element, as torch.log; on autocast's float32 list."""
    return _ew("log", input)


@autocast_op(name="pow")
@_op
def pow(input, exponent):  # noqa: A001 - torch's name
    """input raised to exponent (a number or an array, broadcast), as torch.pow; on autocast's float32 list."""
    if _is_number(exponent):
        if not isinstance(exponent, numbers.Integral) and as_dtype(input.dtype).kind in "biu":
            input = _C.cast(input, F32)  # integers to a float power: float32, as torch
        return _ew("pow_scalar", input, param=float(exponent), name="pow")
    return _ew("pow", input, exponent, names=("input", "exponent"))


@_backward_op
def pow_backward(grad_output, input, exponent):
    """The gradient of pow(input, exponent) with respect to input, exponent * input ** (exponent - 1),
    in input's dtype, shaped as grad_output and input broadcast. Zero where the exponent is 0, as
    torch's (0 ** -1 would make it NaN); with a number exponent 0 even where grad_output is NaN, as
    torch's zeros_like (with an array exponent torch's where() does that too, ampc's kernel multiplies
    by grad_output last: NaN there)."""
    op = "pow_backward"
    dtype = _floating_dtype(op, "input", input)
    if not _is_number(exponent):
        _check_grad_output(op, grad_output)
        return _ew("pow_base_grad", input, exponent, grad_output, dtype=dtype, name=op,
                   names=("input", "exponent", "grad_output"))
    if exponent == 0:  # grad_output a number (as the other paths take it) or an array
        grad_shape = () if _is_number(grad_output) else _shape_of(grad_output, op, "grad_output")
        return _C.zeros_like(input, dtype=dtype, shape=np.broadcast_shapes(grad_shape, tuple(input.shape)))
    return _gradient_at_input("pow_scalar_grad", op, grad_output, input, param=float(exponent))


@_backward_op
def pow_exponent_backward(grad_output, input, exponent):
    """The gradient of pow(input, exponent) with respect to an array exponent, input ** exponent *
    log(input), in exponent's dtype; zero where input is 0 and exponent >= 0, as torch's (log 0 is
    -inf)."""
    op = "pow_exponent_backward"
    _check_grad_output(op, grad_output)
    return _ew("pow_exponent_grad", input, exponent, grad_output, dtype=_floating_dtype(op, "exponent", exponent),
               name=op, names=("input", "exponent", "grad_output"))


@_op
def sqrt(input):
    """The square root of each element, as torch.sqrt."""
    return _ew("sqrt", input)


@autocast_op(name="rsqrt")
@_op
def rsqrt(input):
    """1 / sqrt(input), rounded once (float32 under CUDA autocast, as torch's)."""
    return _ew("rsqrt", input)


@_backward_op
def sqrt_backward(grad_output, output):
    """grad_output / (2 sqrt(input)), from sqrt's output: inf at 0, as torch's."""
    return _ew("div", grad_output, output, scale=0.5, name="sqrt_backward", names=("grad_output", "output"))


@_backward_op
def rsqrt_backward(grad_output, output):
    """-grad_output * rsqrt(input)^3 / 2, from rsqrt's output; the cube in the accumulation dtype and
    the product rounded once."""
    dtype = _floating_dtype("rsqrt_backward", "output", output)
    result = _result_type("rsqrt_backward", [_floating_dtype("rsqrt_backward", "grad_output", grad_output), dtype])
    acc = _acc(dtype)
    cube = _ew("mul", _ew("mul", output, output, dtype=acc, name="rsqrt_backward", names=("output", "output")),
               output, dtype=acc, name="rsqrt_backward", names=("output", "output"))
    return _ew("mul", grad_output, cube, scale=-0.5, dtype=result, name="rsqrt_backward",
               names=("grad_output", "output"))


@_backward_op
def exp_backward(grad_output, output):
    """The gradient of exp's input from its output: grad_output * output."""
    return _ew("mul", grad_output, output, name="exp_backward", names=("grad_output", "output"))


@_gradient_of(log)
@_backward_op
def log_backward(grad_output, input):
    """The gradient of log's input: grad_output / input."""
    return _ew("div", grad_output, input, name="log_backward", names=("grad_output", "input"))


# --------------------------------------------------------------------------------------------
# Precision-preserving ops: they run in their inputs' (promoted) dtype
# --------------------------------------------------------------------------------------------


@_op
def relu(input, inplace=False):
    """max(input, 0) elementwise, as torch.nn.functional.relu; inplace=True writes input."""
    return _in_place(input, _ew("relu", input), inplace)


@_backward_op
def relu_backward(grad_output, input):
    """The gradient of relu's input: grad_output where input > 0, else 0."""
    return _gradient_at_input("relu_grad", "relu_backward", grad_output, input)


@_op
def gelu(input, approximate="none"):
    """The Gaussian error linear unit, as torch.nn.functional.gelu: exact (approximate='none') or its tanh
    approximation."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _ew("gelu" if approximate == "none" else "gelu_tanh", input, name="gelu")


@_gradient_of(gelu, "approximate")
@_backward_op
def gelu_backward(grad_output, input, approximate="none"):
    """The gradient of gelu's input, for the same approximate."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu_backward: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _gradient_at_input("gelu_grad" if approximate == "none" else "gelu_tanh_grad", "gelu_backward",
                              grad_output, input)


@_op
def silu(input, inplace=False):
    """input * sigmoid(input) elementwise (swish), as torch.nn.functional.silu; inplace=True writes input."""
    return _in_place(input, _ew("silu", input), inplace)


@_gradient_of(silu)
@_backward_op
def silu_backward(grad_output, input):
    """The gradient of silu's input."""
    return _gradient_at_input("silu_grad", "silu_backward", grad_output, input)


def _softplus_numbers(op, beta, threshold):
    for name, value in (("beta", beta), ("threshold", threshold)):
        if not _is_number(value):
            raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    return float(beta), float(threshold)


@autocast_op(name="softplus")
@_op
def softplus(input, beta=1.0, threshold=20.0):
    """log(1 + exp(beta * input)) / beta, and input itself where beta * input > threshold, as torch's
    (float32 under CUDA autocast)."""
    beta, threshold = _softplus_numbers("softplus", beta, threshold)
    return _ew("softplus", input, param=beta, param2=threshold)


@_gradient_of(softplus, "beta", "threshold")
@_backward_op
def softplus_backward(grad_output, input, beta=1.0, threshold=20.0):
    """grad_output * sigmoid(beta * input), grad_output itself where beta * input > threshold, as torch's."""
    beta, threshold = _softplus_numbers("softplus_backward", beta, threshold)
    return _gradient_at_input("softplus_grad", "softplus_backward", grad_output, input, beta, threshold)


@_op
def mish(input, inplace=False):
    """input * tanh(softplus(input)), as torch's."""
    return _in_place(input, _ew("mish", input), inplace)


@_gradient_of(mish)
@_backward_op
def mish_backward(grad_output, input):
    """The gradient of mish's input."""
    return _gradient_at_input("mish_grad", "mish_backward", grad_output, input)


@_op
def sigmoid(input):
    """1 / (1 + exp(-input)) elementwise, as torch.sigmoid."""
    return _ew("sigmoid", input)


@_op
def tanh(input):
    """The hyperbolic tangent of each element, as torch.tanh."""
    return _ew("tanh", input)


@_op
def abs(input):  # noqa: A001 - torch's name
    """The absolute value of each element, as torch.abs."""
    return _ew("abs", input)


@_gradient_of(abs)
@_backward_op
def abs_backward(grad_output, input):
    """grad_output * sign(input): 0 at 0 and where input is NaN, as torch's."""
    return _gradient_at_input("mul", "abs_backward", grad_output, _ew("sign", input, name="abs_backward"))


@_op
def add(input, other, *, alpha=1):
    """input + alpha * other, broadcast, with torch's type promotion, as torch.add."""
    return _ew("add", input, other, param=float(alpha))


@_op
def sub(input, other, *, alpha=1):
    """input - alpha * other, broadcast, with torch's type promotion, as torch.sub."""
    return _ew("add", input, other, param=-float(alpha), name="sub")


@_op
def mul(input, other):
    """input * other, broadcast, with torch's type promotion, as torch.mul."""
    return _ew("mul", input, other)


@_op
def div(input, other):
    """input / other (true division), broadcast, with torch's type promotion, as torch.div."""
    return _ew("div", input, other)
