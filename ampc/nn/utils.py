"""torch.nn.utils's gradient clipping, for the recipe's `unscale_(optimizer)` then
`clip_grad_norm_(model.parameters(), max_norm)`: ampc's Parameters and anything else with a `.grad`
that is a NumPy array or a DLPack buffer (torch tensors, CuPy arrays). The norm and the clip are
GradScaler's fused pass (`unscale_(optimizer, max_norm=...)` on a scaler that scales nothing): one
read for the norm, one read and write for the clip."""

import math

import numpy as np

from ampc import _C
from ampc.autograd import _host_scalar
from ampc.nn._common import ew, floating_dtype, is_number

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


class _Parameters:
    """The gradients to clip, as the scaler reads an optimizer's."""

    def __init__(self, params):
        self.param_groups = [{"params": params}]


def _with_grads(op, parameters):
    """The parameters that have a gradient: one parameter, or an iterable of them (torch's)."""
    if hasattr(parameters, "grad"):  # one parameter (a Parameter, a torch tensor)
        parameters = [parameters]
    try:
        params = list(parameters)
    except TypeError:
        raise TypeError(f"{op}: parameters must be a Parameter or an iterable of them, "
                        f"got {type(parameters).__name__}") from None
    for p in params:
        if not hasattr(p, "grad"):
            raise TypeError(f"{op}: parameters must have a .grad, got {type(p).__name__}")
    return [p for p in params if p.grad is not None]


def _number(op, name, value):
    if not is_number(value):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    return float(value)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients in place so that their total norm (of order norm_type, inf for the
    largest magnitude) is at most max_norm, as torch's: by max_norm / (norm + 1e-6) where that is
    below 1. Returns the total norm as a 0-d float32 array of the gradients' library (0 without
    gradients). A non-finite norm (an inf or NaN gradient) leaves the gradients as they were (torch
    multiplies them by 0 or NaN; a GradScaler skips that step either way) and, with
    error_if_nonfinite=True, raises torch's RuntimeError. `foreach` is taken for torch's signature:
    the pass is fused already."""
    op = "clip_grad_norm_"
    max_norm, norm_type = _number(op, "max_norm", max_norm), _number(op, "norm_type", norm_type)
    params = _with_grads(op, parameters)
    if not params:
        return np.zeros((), np.float32)
    norm = _C.GradScaler("cpu", enabled=False).unscale_(_Parameters(params), max_norm=max_norm, norm_type=norm_type)
    if error_if_nonfinite and not math.isfinite(_host_scalar(norm)):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so "
                           "it cannot be clipped. To disable this error and scale the gradients by the non-finite "
                           "norm anyway, set `error_if_nonfinite=False`")
    return norm


def clip_grad_value_(parameters, clip_value, foreach=None):
    """Clamp each gradient in place to [-clip_value, clip_value], as torch's (NaN stays NaN); every
    gradient clamped before any is written, so that one the kernel refuses leaves them all as they were."""
    op = "clip_grad_value_"
    clip_value = _number(op, "clip_value", clip_value)
    grads = [p.grad for p in _with_grads(op, parameters)]
    for g in grads:
        floating_dtype(op, "a parameter's .grad", g)
    clamped = [ew("maximum", ew("minimum", g, clip_value, name=op), -clip_value, name=op) for g in grads]
    for g, c in zip(grads, clamped):
        _C.cast(c, out=g)
