"""The spatial ops of ampc.nn.functional: convolutions, batch norm and pooling over NCHW images.

conv2d and conv1d are on torch's lower-precision list (float16/bfloat16 under autocast, float32
accumulation); batch_norm and the pools are on none of torch's lists, so they run in their
input's dtype, with batch norm's statistics, weights and running averages in float32 as cuDNN
keeps them. On the GPU the convolutions and batch norm are cuDNN's, and a channels-last input
(torch.channels_last) stays channels-last.
"""

import sys

from ampc import _C
from ampc._C import as_dtype
from ampc._arguments import as_int
from ampc.amp import autocast_op
from ampc.nn._shape_ops import _slice, reshape

_OPS = _C._ew_ops()
_MAX, _AVG, _ADAPTIVE_AVG = 0, 1, 2


def _int(op, name, value):
    return as_int(op, name, value, "an int or a pair of ints")


def _pair(op, name, value):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return (_int(op, name, value),) * 2
    value = tuple(_int(op, name, v) for v in value)
    if len(value) == 1:
        return value * 2
    if len(value) != 2:
        raise ValueError(f"{op}: {name} must be an int or a pair of ints, got {value}")
    return value


def _single(op, name, value):
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        return _int(op, name, value)
    value = tuple(_int(op, name, v) for v in value)
    if len(value) != 1:
        raise ValueError(f"{op}: {name} must be an int or a 1-tuple, got {value}")
    return value[0]


def _reshape(x, shape):
    return reshape(x, shape)


# --------------------------------------------------------------------------------------------
# Convolutions: lower precision under autocast
# --------------------------------------------------------------------------------------------


def _cudnn(function, *args, **kwargs):
    """function(*args, **kwargs), one of _C's convolutions, then on stderr the lines AMPC_CONV_DEBUG
    asked of it on the GPU (a shape's timed algorithms and engines, and the one chosen): ampc._cuda
    keeps them, as nothing in C prints. Printed when the call fails too."""
    try:
        return function(*args, **kwargs)
    finally:
        lines = _C._cuda_conv_report()
        if lines and sys.stderr is not None:
            sys.stderr.write(lines)


def _same_padding(op, kernel, stride, dilation):
    """padding='same' as torch computes it: (padding on both sides, the extra row or column at the
    end) per dimension; an even effective kernel needs one more at the end than at the start."""
    if any(s != 1 for s in stride):
        raise ValueError(f"{op}: padding='same' is not supported for strided convolutions")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    return tuple(t // 2 for t in totals), tuple(t % 2 for t in totals)


def _conv2d_args(op, weight, stride, padding, dilation):
    """(stride, padding, dilation, extra): extra is the (rows, columns) padding='same' adds at the
    end of the image beyond the symmetric padding."""
    stride, dilation = _pair(op, "stride", stride), _pair(op, "dilation", dilation)
    extra = (0, 0)
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        elif padding == "same":
            padding, extra = _same_padding(op, tuple(weight.shape[2:]), stride, dilation)
        else:
            raise ValueError(f"{op}: Invalid padding string {padding!r}, should be one of ('valid', 'same')")
    return stride, _pair(op, "padding", padding), dilation, extra


def _window(x, h, w):
    """x[..., :h, :w] (a view)."""
    return _slice(_slice(x, len(x.shape) - 2, 0, h), len(x.shape) - 1, 0, w)


def _pad_end(x, extra):
    """x (N, C, H, W) with extra zero rows and columns at the end (torch's asymmetric 'same')."""
    if extra == (0, 0):
        return x
    n, c, h, w = x.shape
    out = _C.zeros_like(x, shape=(n, c, h + extra[0], w + extra[1]))
    _C.cast(x, out=_window(out, h, w))
    return out


def _batched(op, input, spatial):
    """(input as batched, whether it was unbatched): torch accepts one image without the batch."""
    ndim = len(input.shape)
    if ndim == spatial + 1:
        return _reshape(input, (1,) + tuple(input.shape)), True
    if ndim != spatial + 2:
        raise ValueError(f"{op}: Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input to {op}, but "
                         f"got input of size: {list(input.shape)}")
    return input, False


@autocast_op(name="conv2d")
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d: input (N, C, H, W) or (C, H, W), weight (K, C / groups, R, S)."""
    stride, padding, dilation, extra = _conv2d_args("conv2d", weight, stride, padding, dilation)
    x, unbatched = _batched("conv2d", input, 2)
    y = _cudnn(_C._conv2d, _pad_end(x, extra), weight, bias, stride, padding, dilation,
               as_int("conv2d", "groups", groups))
    return _reshape(y, tuple(y.shape)[1:]) if unbatched else y


def conv2d_backward(grad_output, input, weight, stride=1, padding=0, dilation=1, groups=1, *, input_grad=True,
                    weight_grad=True, bias_grad=True, _op="conv2d_backward"):
    """(grad_input, grad_weight, grad_bias) of conv2d; None for the ones not asked for. (_op: the
    name in messages, conv1d_backward's when it runs through here.)"""
    stride, padding, dilation, extra = _conv2d_args(_op, weight, stride, padding, dilation)
    x, unbatched = _batched(_op, input, 2)
    padded = _pad_end(x, extra)
    dy = _reshape(grad_output, (1,) + tuple(grad_output.shape)) if unbatched else grad_output
    args = (stride, padding, dilation, as_int(_op, "groups", groups))
    gi = _cudnn(_C._conv2d_backward, dy, padded, weight, *args, "input", op=_op) if input_grad else None
    gw = _cudnn(_C._conv2d_backward, dy, padded, weight, *args, "weight", op=_op) if weight_grad else None
    if gi is not None and extra != (0, 0):  # the padding's own gradient is dropped
        gi = _window(gi, x.shape[2], x.shape[3])
    gb = _C._sum(dy, (0, 2, 3)) if bias_grad else None
    if gi is not None and unbatched:
        gi = _reshape(gi, tuple(input.shape))
    return gi, gw, gb


def _conv1d_as_2d(op, input, weight, stride, padding, dilation):
    """conv1d's arguments as conv2d's over images of one row."""
    x, unbatched = _batched(op, input, 1)
    n, c, length = x.shape
    k, cg, s = weight.shape
    pad2 = padding if isinstance(padding, str) else (0, _single(op, "padding", padding))
    return (_reshape(x, (n, c, 1, length)), _reshape(weight, (k, cg, 1, s)), (1, _single(op, "stride", stride)),
            pad2, (1, _single(op, "dilation", dilation)), unbatched)


@autocast_op(name="conv1d")
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d: input (N, C, L) or (C, L), weight (K, C / groups, S)."""
    x, w, stride, padding, dilation, unbatched = _conv1d_as_2d("conv1d", input, weight, stride, padding, dilation)
    stride, padding, dilation, extra = _conv2d_args("conv1d", w, stride, padding, dilation)
    y = _cudnn(_C._conv2d, _pad_end(x, extra), w, bias, stride, padding, dilation, as_int("conv1d", "groups", groups),
               op="conv1d")
    n, k, _, length = y.shape
    return _reshape(y, (k, length) if unbatched else (n, k, length))


def conv1d_backward(grad_output, input, weight, stride=1, padding=0, dilation=1, groups=1, *, input_grad=True,
                    weight_grad=True, bias_grad=True):
    """(grad_input, grad_weight, grad_bias) of conv1d."""
    x, w, stride, padding, dilation, unbatched = _conv1d_as_2d("conv1d_backward", input, weight, stride, padding,
                                                               dilation)
    dy = _reshape(grad_output, (x.shape[0], weight.shape[0], 1, grad_output.shape[-1]))
    gi, gw, gb = conv2d_backward(dy, x, w, stride, padding, dilation, groups, input_grad=input_grad,
                                 weight_grad=weight_grad, bias_grad=bias_grad, _op="conv1d_backward")
    if gi is not None:
        gi = _reshape(gi, tuple(input.shape))
    if gw is not None:
        gw = _reshape(gw, tuple(weight.shape))
    return gi, gw, gb


# --------------------------------------------------------------------------------------------
# Batch norm: the input's dtype, statistics in float32
# --------------------------------------------------------------------------------------------


def batch_norm_forward(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                       eps=1e-5):
    """(output, save_mean, save_rstd); the saved statistics are None in evaluation mode."""
    if momentum is None:
        raise ValueError("batch_norm: momentum must be a number (torch.nn.BatchNorm turns None into a cumulative "
                         "average before it calls batch_norm)")
    y, mean, rstd = _C._batch_norm(input, weight, bias, running_mean, running_var, bool(training), float(momentum),
                                   float(eps))
    if tuple(y.shape) != tuple(input.shape):
        y = _reshape(y, tuple(input.shape))
    return y, mean, rstd


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm over input (N, C, ...): per channel; when training the running
    statistics move in place towards the batch's mean and unbiased variance."""
    return batch_norm_forward(input, running_mean, running_var, weight, bias, training, momentum, eps)[0]


def _channel_shape(input, values):
    """A (C,) array shaped to broadcast over input (N, C, ...)."""
    return _reshape(values, (-1,) + (1,) * (len(input.shape) - 2))


def _channel_dims(input):
    return (0,) + tuple(range(2, len(input.shape)))


def batch_norm_backward(grad_output, input, weight=None, running_mean=None, running_var=None, training=False,
                        eps=1e-5, *, save_mean=None, save_rstd=None, input_grad=True, weight_grads=True):
    """(grad_input, grad_weight, grad_bias) of batch_norm; save_mean and save_rstd as
    batch_norm_forward returned them (recomputed when not given). In evaluation mode the running
    statistics are constants. grad_weight/grad_bias are None without weight."""
    weight_grads = weight_grads and weight is not None
    wdtype = as_dtype(weight.dtype) if weight is not None else None
    if training:
        if save_mean is None or save_rstd is None:
            _, save_mean, save_rstd = _C._batch_norm(input, None, None, None, None, True, 0.0, float(eps))
        gi, gw, gb = _C._batch_norm_backward(grad_output, input, weight, save_mean, save_rstd, float(eps),
                                             input_grad, weight_grads)
        if gi is not None and tuple(gi.shape) != tuple(input.shape):
            gi = _reshape(gi, tuple(input.shape))
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm_backward: running_mean and running_var must be defined in evaluation mode")
        acc = as_dtype("float64") if as_dtype(input.dtype) == as_dtype("float64") else as_dtype("float32")
        rstd = _C._ew(_OPS["rsqrt"], _C._ew(_OPS["add"], running_var, float(eps), dtype=acc))
        gi = gw = gb = None
        if input_grad:
            k = rstd if weight is None else _C._ew(_OPS["mul"], weight, rstd, dtype=acc)
            gi = _C._ew(_OPS["mul"], grad_output, _channel_shape(input, k), dtype=as_dtype(input.dtype))
        if weight_grads:
            dims = _channel_dims(input)
            xhat = _C._ew(_OPS["mul"], _C._ew(_OPS["add"], input, _channel_shape(input, running_mean), param=-1.0,
                                              dtype=acc), _channel_shape(input, rstd))
            gw = _C._sum(_C._ew(_OPS["mul"], grad_output, xhat, dtype=acc), dims)
            gb = _C._sum(grad_output, dims, dtype=acc)
    if gw is not None and as_dtype(gw.dtype) != wdtype:
        gw = _C._ew(_OPS["copy"], gw, dtype=wdtype)
        gb = _C._ew(_OPS["copy"], gb, dtype=wdtype)
    return gi, gw, gb


# --------------------------------------------------------------------------------------------
# Pooling: the input's dtype
# --------------------------------------------------------------------------------------------


def _pool_args(op, kernel_size, stride, padding, dilation):
    kernel = _pair(op, "kernel_size", kernel_size)
    stride = kernel if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _pair(op, "stride",
                                                                                                           stride)
    return kernel, stride, _pair(op, "padding", padding), _pair(op, "dilation", dilation)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=True):
    """(output, indices): the flat h * w position of each window's maximum (int64), as torch's."""
    kernel, stride, padding, dilation = _pool_args("max_pool2d", kernel_size, stride, padding, dilation)
    return _C._pool(input, _MAX, kernel, stride, padding, dilation, bool(ceil_mode), False, 0, None)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """The maximum over each kernel_size window of an (N, C, H, W) input, as torch.nn.functional.max_pool2d;
    return_indices=True also gives each maximum's flat index in its plane."""
    y, indices = max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)
    return (y, indices) if return_indices else y


def max_pool2d_backward(grad_output, input, indices, kernel_size, stride=None, padding=0, dilation=1,
                        ceil_mode=False):
    """The gradient of max_pool2d's input; indices as max_pool2d_with_indices returned them
    (recomputed when None)."""
    if indices is None:
        indices = max_pool2d_with_indices(input, kernel_size, stride, padding, dilation, ceil_mode)[1]
    kernel, stride, padding, dilation = _pool_args("max_pool2d_backward", kernel_size, stride, padding, dilation)
    return _C._pool_backward(grad_output, input, indices, _MAX, kernel, stride, padding, dilation, bool(ceil_mode),
                             False, 0, None)


def _divisor(op, divisor_override):
    if divisor_override is None:
        return 0
    divisor = as_int(op, "divisor_override", divisor_override)
    if divisor == 0:
        raise ValueError(f"{op}: divisor must be not zero")
    return divisor


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """The mean over each kernel_size window of an (N, C, H, W) input, as torch.nn.functional.avg_pool2d
    (count_include_pad and divisor_override as torch's)."""
    kernel, stride, padding, _ = _pool_args("avg_pool2d", kernel_size, stride, padding, 1)
    return _C._pool(input, _AVG, kernel, stride, padding, (1, 1), bool(ceil_mode), bool(count_include_pad),
                    _divisor("avg_pool2d", divisor_override), None)[0]


def avg_pool2d_backward(grad_output, input, kernel_size, stride=None, padding=0, ceil_mode=False,
                        count_include_pad=True, divisor_override=None):
    """The gradient of avg_pool2d's input, for the same arguments."""
    kernel, stride, padding, _ = _pool_args("avg_pool2d_backward", kernel_size, stride, padding, 1)
    return _C._pool_backward(grad_output, input, None, _AVG, kernel, stride, padding, (1, 1), bool(ceil_mode),
                             bool(count_include_pad), _divisor("avg_pool2d_backward", divisor_override), None)


def _adaptive_size(op, input, output_size):
    if output_size is None:  # None is for one side (keep the input's), not for both
        raise TypeError(f"{op}: output_size must be an int or a pair, got None")
    if isinstance(output_size, (str, bytes)) or not hasattr(output_size, "__iter__"):
        output_size = (output_size, output_size)
    output_size = tuple(output_size)
    if len(output_size) != 2:
        raise ValueError(f"{op}: output_size must be an int or a pair, got {output_size}")
    shape = tuple(input.shape)
    return tuple(shape[len(shape) - 2 + i] if s is None else _int(op, "output_size", s)
                 for i, s in enumerate(output_size))


_UNUSED = (1, 1)


def adaptive_avg_pool2d(input, output_size):
    """The mean over the windows that split each plane into output_size cells, as
    torch.nn.functional.adaptive_avg_pool2d."""
    size = _adaptive_size("adaptive_avg_pool2d", input, output_size)
    return _C._pool(input, _ADAPTIVE_AVG, _UNUSED, _UNUSED, (0, 0), _UNUSED, False, False, 0, size)[0]


def adaptive_avg_pool2d_backward(grad_output, input, output_size=None):
    """The gradient of adaptive_avg_pool2d's input, for the same output_size."""
    size = tuple(grad_output.shape)[-2:] if output_size is None else _adaptive_size("adaptive_avg_pool2d_backward",
                                                                                  input, output_size)
    return _C._pool_backward(grad_output, input, None, _ADAPTIVE_AVG, _UNUSED, _UNUSED, (0, 0), _UNUSED, False, False,
                             0, size)


__all__ = ["conv2d", "conv2d_backward", "conv1d", "conv1d_backward", "batch_norm", "batch_norm_backward",
           "max_pool2d", "max_pool2d_with_indices", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward",
           "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"]
