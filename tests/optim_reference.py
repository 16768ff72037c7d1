"""References for ampc.optim's steps, written from torch's algorithms, independently of the C code.

Two kinds:

- ``*_step_exact``: the arithmetic of torch 2.11's fused CUDA optimizers (fused=True) spelled out
  in NumPy, operation by operation: the element and the hyperparameters in the element's opmath
  type (float32, float64 for float64 parameters), each operation rounded once, and fused
  multiply-adds where torch's build has them (``fma`` below, emulated exactly). ampc must match
  it bit for bit (NumPy's +, -, *, / and sqrt are correctly rounded IEEE operations).
- ``*_step_f64``: the textbook algorithm in float64 throughout (torch's documentation), to which
  a float32 implementation is close but not equal; it catches a formula that the exact
  reference and the kernel might share by mistake.

Arrays are NumPy arrays of the parameter's dtype (ml_dtypes.bfloat16 included); state is a
dict of such arrays. Every function returns new arrays and leaves its inputs alone.
"""

import math

import numpy as np

F64 = np.float64


def opmath(dtype):
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _store(x, dtype):
    """Round an opmath value to the storage dtype the way ampc stores it: through float32."""
    if np.dtype(dtype) == np.float64:
        return x.astype(np.float64)
    return x.astype(np.float32).astype(dtype)


def _two_sum(a, b):
    """s + e == a + b exactly, s the rounded sum (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _add_round_to_odd(a, b):
    """a + b in float64 rounded to odd: the truncated sum with its last bit set when inexact.
    Rounding that once more to a narrower format is correctly rounded (Boldo and Melquiond)."""
    s, e = _two_sum(a, b)
    even = (s.view(np.int64) & 1) == 0
    return np.where((e != 0) & even, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)


def _two_product(a, b):
    """h + l == a * b exactly (Dekker, with Veltkamp's split), barring overflow and underflow
    (which the tests' data stay far from)."""
    def split(x):
        t = F64(134217729.0) * x  # 2**27 + 1
        hi = t - (t - x)
        return hi, x - hi
    h = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return h, ((ah * bh - h) + ah * bl + al * bh) + al * bl


def fma(a, b, c):
    """a * b + c rounded once, in the type of the arrays (float32 or float64), as C's fmaf/fma:
    float32 through float64 (the product is exact there) and one rounding to odd; float64 by
    Boldo and Melquiond's emulation from error-free transformations."""
    a, b, c = np.broadcast_arrays(np.asarray(a), np.asarray(b), np.asarray(c))
    dtype = np.result_type(a, b, c)
    with np.errstate(all="ignore"):
        if dtype == np.float32:
            x = a.astype(F64) * b.astype(F64)
            plain = x + c.astype(F64)
            exact = _add_round_to_odd(x, c.astype(F64))
            return np.where(np.isfinite(plain), exact, plain).astype(np.float32)
        a, b, c = a.astype(F64), b.astype(F64), c.astype(F64)
        uh, ul = _two_product(a, b)
        th, tl = _two_sum(c, ul)
        vh, vl = _two_sum(uh, th)
        out = vh + _add_round_to_odd(vl, tl)
        plain = a * b + c
        return np.where(np.isfinite(plain) & np.isfinite(uh), out, plain)


def unscaled(g, grad_scale):
    O = opmath(g.dtype)
    g = g.astype(O)
    if grad_scale is None:
        return g
    return g / O(np.float32(grad_scale))


def _operands(p, g, grad_scale, maximize):
    """Both steps' start: the parameter in opmath, the gradient unscaled (as written back)
    and then negated when maximizing."""
    G = unscaled(g, grad_scale)
    return p.astype(opmath(p.dtype)), G, -G if maximize else G


def pow_rounded(x, y, O):
    """beta ** step in opmath: float64 pow() rounded once, as ampc's CPU kernels take it
    (CUDA's powf differs in the last bit for a few step counts; see kernels/optim_math.h)."""
    return O(math.pow(float(x), float(y)))


def sgd_step_exact(p, g, buf, first, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                   maximize=False, grad_scale=None):
    """(new param, new buffer or None, the gradient as written back)."""
    dtype = p.dtype
    O = opmath(dtype)
    P, g_out, G = _operands(p, g, grad_scale, maximize)
    if weight_decay != 0:
        G = fma(O(weight_decay), P, G)
    new_buf = None
    if momentum != 0:
        M = O(momentum)
        b = G if first else fma(O(1) - O(dampening), G, M * buf.astype(O))
        new_buf = _store(b, dtype)
        G = fma(M, b, G) if nesterov else b
    P = fma(-O(lr), G, P)
    return _store(P, dtype), new_buf, _store(g_out, dtype)


def adam_step_exact(p, g, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
                    maximize=False, decoupled=False, grad_scale=None):
    """(new param, new state, the gradient as written back); state["step"] is a float."""
    dtype = p.dtype
    O = opmath(dtype)
    B1, B2, LR, WD = O(beta1), O(beta2), O(lr), O(weight_decay)
    step = float(np.float32(state["step"]) + np.float32(1))
    step_size = LR / (O(1) - pow_rounded(B1, step, O))
    bc2_sqrt = np.sqrt(O(1) - pow_rounded(B2, step, O))
    P, g_out, G = _operands(p, g, grad_scale, maximize)
    if weight_decay != 0:
        if decoupled:
            P = fma(-(LR * WD), P, P)
        else:
            G = fma(P, WD, G)
    m = fma(B1, state["exp_avg"].astype(O), fma(-B1, G, G))
    G2 = G * G
    v = fma(B2, state["exp_avg_sq"].astype(O), fma(-B2, G2, G2))
    new = {"step": step, "exp_avg": _store(m, dtype), "exp_avg_sq": _store(v, dtype)}
    second = v
    if amsgrad:
        vmax = state["max_exp_avg_sq"].astype(O)
        vmax = np.where(vmax < v, v, vmax)
        new["max_exp_avg_sq"] = _store(vmax, dtype)
        second = vmax
    denom = np.sqrt(second) / bc2_sqrt + O(eps)
    P = P - step_size * m / denom
    return _store(P, dtype), new, _store(g_out, dtype)


def sgd_step_f64(p, g, buf, first, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                 maximize=False, grad_scale=None):
    p, g = p.astype(F64), g.astype(F64)
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    g = g + weight_decay * p
    if momentum != 0:
        buf = g.copy() if first else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return p - lr * g, buf


def adam_step_f64(p, g, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
                  maximize=False, decoupled=False, grad_scale=None):
    p, g = p.astype(F64), g.astype(F64)
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    step = state["step"] + 1
    if decoupled:
        p = p * (1 - lr * weight_decay)
    else:
        g = g + weight_decay * p
    m = beta1 * state["exp_avg"] + (1 - beta1) * g
    v = beta2 * state["exp_avg_sq"] + (1 - beta2) * g * g
    new = {"step": step, "exp_avg": m, "exp_avg_sq": v}
    second = v
    if amsgrad:
        second = new["max_exp_avg_sq"] = np.maximum(state["max_exp_avg_sq"], v)
    denom = np.sqrt(second) / math.sqrt(1 - beta2**step) + eps
    return p - lr / (1 - beta1**step) * m / denom, new
