"""float64 references for ampc.nn.functional, written from the formulas (not from ampc's
kernels), and the tolerance each dtype's rounding allows."""

import math
from typing import Callable, NamedTuple

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
FLOATS = [F32, F16, BF16, F64]

# One rounding of the output plus float32 arithmetic: the relative error a correct kernel may
# show against the float64 reference of its (already rounded) inputs.
RTOL = {F32: 1e-5, F16: 2.0**-10, BF16: 2.0**-7, F64: 1e-12}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def f64(x):
    return np.asarray(x).astype(np.float64)


def random(rng, shape, dtype, scale=1.0):
    """Fresh random data, exactly representable in dtype (the reference sees the same values)."""
    return (rng.standard_normal(shape) * scale).astype(dtype)


def assert_close(out, ref, dtype, *, scale=None, rtol=None, what=""):
    """Every element of out (dtype `dtype`) within the dtype's tolerance of the float64 ref:
    |out - ref| <= rtol * (|ref| + scale), scale a magnitude of the terms that were summed."""
    out = np.asarray(out)
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {dtype}"
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape}, expected {ref.shape}"
    rtol = RTOL[dtype] if rtol is None else rtol
    got = out.astype(np.float64)
    if scale is None:
        scale = np.abs(ref).max() if ref.size else 0.0
    # plus one spacing of the dtype's subnormals: a result that small keeps fewer significant bits
    tol = rtol * (np.abs(ref) + scale) + float(ml_dtypes.finfo(dtype).smallest_subnormal)
    same_nan = np.isnan(got) == np.isnan(ref)
    assert same_nan.all(), f"{what}: NaN where the reference has none (or the other way)"
    bad = ~(np.abs(got - ref) <= tol) & ~np.isnan(ref)
    assert not bad.any(), (
        f"{what}: {bad.sum()} of {bad.size} elements off; worst {np.abs(got - ref)[bad].max():.3g} "
        f"at tolerance {tol[bad].min():.3g}")


def gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def silu(x):
    return x / (1 + np.exp(-x))


def softplus(x, beta=1.0, threshold=20.0):
    """torch's: log(1 + e^(beta x)) / beta, x itself where beta x > threshold."""
    return np.where(x * beta > threshold, x, np.logaddexp(0, x * beta) / beta)


def softplus_grad(g, x, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, g, g / (1 + np.exp(-x * beta)))


def mish(x):
    return x * np.tanh(np.logaddexp(0, x))


def mish_grad(g, x):
    t = np.tanh(np.logaddexp(0, x))
    return g * (t + x / (1 + np.exp(-x)) * (1 - t * t))


def relu(x):
    return np.maximum(x, 0)


def softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=dim, keepdims=True)


def log_softmax(x, dim):
    m = x.max(axis=dim, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=dim, keepdims=True))


def layer_norm(x, n_dims, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - n_dims, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """torch.nn.functional.cross_entropy in float64, class dimension 1 (or 0 for 1-D input)."""
    cdim = 0 if x.ndim == 1 else 1
    logp = log_softmax(x, cdim)
    logp = np.moveaxis(logp, cdim, -1)  # (..., C)
    c = logp.shape[-1]
    w = np.ones(c) if weight is None else weight
    if np.issubdtype(np.asarray(target).dtype, np.floating):
        q = np.moveaxis(target, cdim, -1) * (1 - label_smoothing) + label_smoothing / c
        per = -(w * q * logp).sum(-1)
        if reduction == "none":
            return per
        return per.sum() / (per.size if reduction == "mean" else 1)
    t = np.asarray(target)
    valid = t != ignore_index
    tt = np.where(valid, t, 0)
    picked = np.take_along_axis(logp, tt[..., None], -1)[..., 0]
    wt = np.where(valid, w[tt], 0.0)
    per = -(1 - label_smoothing) * wt * picked
    if label_smoothing > 0:
        per = per - np.where(valid, label_smoothing / c * (w * logp).sum(-1), 0.0)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.sum() / wt.sum()


def nll_loss(logp, target, weight=None, ignore_index=-100, reduction="mean"):
    cdim = 0 if logp.ndim == 1 else 1
    lp = np.moveaxis(logp, cdim, -1)
    c = lp.shape[-1]
    w = np.ones(c) if weight is None else weight
    t = np.asarray(target)
    valid = t != ignore_index
    tt = np.where(valid, t, 0)
    picked = np.take_along_axis(lp, tt[..., None], -1)[..., 0]
    wt = np.where(valid, w[tt], 0.0)
    per = -wt * picked
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.sum() / wt.sum()


def reduce(per, reduction):
    if reduction == "none":
        return per
    return per.sum() if reduction == "sum" else per.mean()


def bce_with_logits(x, y, w=None):
    per = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    return per if w is None else per * w


def bce(p, y, w=None):
    per = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log1p(-p), -100))
    return per if w is None else per * w


def numeric_grad(f, x, r, h=1e-6):
    """d(sum(f(x) * r))/dx by central differences, every element (float64)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        up = np.sum(np.asarray(f(x), np.float64) * r)
        flat[i] = old - h
        down = np.sum(np.asarray(f(x), np.float64) * r)
        flat[i] = old
        gflat[i] = (up - down) / (2 * h)
    return g


# --------------------------------------------------------------------------------------------
# The pointwise ops the op tests share: one entry an op, read by test_ops.py, test_ops_gpu.py and
# test_ops_properties(_gpu).py, each taking the entries its lists name. A new pointwise op is one
# entry here (its test ids: its name in each list).
# --------------------------------------------------------------------------------------------


class Pointwise(NamedTuple):
    """A pointwise op as the tests call it. forward(F) and backward(F): the op and its gradient
    (grad_output, input) from ampc.nn.functional F; reference: the float64 formula; torch(TF, torch):
    torch's op, or None; lists: "cpu" and "cpu_grad" (test_ops.py's forward and backward lists),
    "gpu" and "gpu_grad" (test_ops_gpu.py's), "properties" (the property tests')."""
    name: str
    forward: Callable
    reference: Callable
    torch: Callable
    backward: Callable
    lists: str


POINTWISE = [
    Pointwise("relu", lambda F: F.relu, relu, lambda TF, torch: TF.relu, lambda F: F.relu_backward,
              "cpu cpu_grad gpu gpu_grad properties"),
    Pointwise("gelu", lambda F: F.gelu, gelu, lambda TF, torch: TF.gelu, lambda F: F.gelu_backward,
              "cpu cpu_grad gpu gpu_grad properties"),
    Pointwise("gelu_tanh", lambda F: lambda x: F.gelu(x, approximate="tanh"), gelu_tanh,
              lambda TF, torch: lambda x: TF.gelu(x, approximate="tanh"),
              lambda F: lambda g, x: F.gelu_backward(g, x, approximate="tanh"), "cpu cpu_grad gpu gpu_grad properties"),
    Pointwise("silu", lambda F: F.silu, silu, lambda TF, torch: TF.silu, lambda F: F.silu_backward,
              "cpu cpu_grad gpu gpu_grad properties"),
    Pointwise("softplus", lambda F: F.softplus, softplus, lambda TF, torch: TF.softplus,
              lambda F: F.softplus_backward, "cpu cpu_grad gpu gpu_grad"),
    Pointwise("softplus_beta", lambda F: lambda x: F.softplus(x, 2.0, 1.5), lambda x: softplus(x, 2.0, 1.5),
              lambda TF, torch: lambda x: TF.softplus(x, 2.0, 1.5),
              lambda F: lambda g, x: F.softplus_backward(g, x, 2.0, 1.5), "cpu cpu_grad gpu gpu_grad"),
    Pointwise("mish", lambda F: F.mish, mish, lambda TF, torch: TF.mish, lambda F: F.mish_backward,
              "cpu cpu_grad gpu gpu_grad"),
    Pointwise("exp", lambda F: F.exp, np.exp, lambda TF, torch: torch.exp,
              lambda F: lambda g, x: F.exp_backward(g, F.exp(x)), "cpu cpu_grad gpu"),
    Pointwise("sigmoid", lambda F: F.sigmoid, lambda x: 1 / (1 + np.exp(-x)), lambda TF, torch: torch.sigmoid,
              None, "cpu gpu"),
    Pointwise("tanh", lambda F: F.tanh, np.tanh, lambda TF, torch: torch.tanh, None, "cpu gpu properties"),
    Pointwise("log", lambda F: F.log, np.log, lambda TF, torch: torch.log, None, "gpu"),
    Pointwise("abs", lambda F: F.abs, np.abs, lambda TF, torch: torch.abs, lambda F: F.abs_backward, "gpu gpu_grad"),
    Pointwise("sqrt", lambda F: lambda x: F.sqrt(F.abs(x)), lambda x: np.sqrt(np.abs(x)),
              lambda TF, torch: lambda x: torch.sqrt(torch.abs(x)), None, "gpu"),
    Pointwise("rsqrt", lambda F: lambda x: F.rsqrt(F.abs(x)), lambda x: 1 / np.sqrt(np.abs(x)),
              lambda TF, torch: lambda x: torch.rsqrt(torch.abs(x)), None, "gpu"),
    Pointwise("pow3", lambda F: lambda x: F.pow(x, 3.0), lambda x: x**3, lambda TF, torch: lambda x: torch.pow(x, 3.0),
              lambda F: lambda g, x: F.pow_backward(g, x, 3.0), "cpu cpu_grad gpu gpu_grad"),
    Pointwise("pow2", lambda F: lambda x: F.pow(x, 2), lambda x: x**2, lambda TF, torch: lambda x: torch.pow(x, 2),
              None, "cpu gpu"),
]


def pointwise(list_name):
    """The entries of POINTWISE in the list `list_name`, in order."""
    return [op for op in POINTWISE if list_name in op.lists.split()]
