"""References for ampc.optim's steps, written from torch's algorithms, independently of the C code.

Two kinds:

- ``*_step_exact``: the arithmetic of torch's fused optimizers (fused=True) spelled out in
  NumPy, operation by operation: the element in its opmath type (float32, float64 for float64
  parameters), the hyperparameters in float64, each line rounded once. ampc must match it bit
  for bit (NumPy's +, -, *, / and sqrt are correctly rounded IEEE operations).
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
    """Round an opmath or float64 value to the storage dtype the way ampc stores it: through
    float32 (one rounding from float32; float64 values are first rounded to float32, as a
    float64 result assigned to a float32 variable in C is)."""
    if np.dtype(dtype) == np.float64:
        return x.astype(np.float64)
    return x.astype(np.float32).astype(dtype)


def unscaled(g, grad_scale):
    O = opmath(g.dtype)
    g = g.astype(O)
    if grad_scale is None:
        return g
    return (g.astype(F64) / F64(np.float32(grad_scale))).astype(O)


def _operands(p, g, grad_scale, maximize):
    """Both steps' start: the parameter in opmath, the gradient unscaled (as written back)
    and then negated when maximizing."""
    G = unscaled(g, grad_scale)
    return p.astype(opmath(p.dtype)), G, -G if maximize else G


def sgd_step_exact(p, g, buf, first, *, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                   maximize=False, grad_scale=None):
    """(new param, new buffer or None, the gradient as written back)."""
    dtype = p.dtype
    O = opmath(dtype)
    P, g_out, G = _operands(p, g, grad_scale, maximize)
    if weight_decay != 0:
        G = (G.astype(F64) + F64(weight_decay) * P.astype(F64)).astype(O)
    new_buf = None
    if momentum != 0:
        if first:
            b = G.astype(F64)
        else:
            b = F64(momentum) * buf.astype(O).astype(F64) + F64(1 - dampening) * G.astype(F64)
        new_buf = _store(b.astype(O), dtype)
        G = (G.astype(F64) + F64(momentum) * b).astype(O) if nesterov else b.astype(O)
    P = (P.astype(F64) - F64(lr) * G.astype(F64)).astype(O)
    return _store(P, dtype), new_buf, _store(g_out, dtype)


def adam_step_exact(p, g, state, *, lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, amsgrad=False,
                    maximize=False, decoupled=False, grad_scale=None):
    """(new param, new state, the gradient as written back); state["step"] is a float."""
    dtype = p.dtype
    O = opmath(dtype)
    step = float(np.float32(state["step"]) + np.float32(1))
    bias_correction1 = O(1 - math.pow(beta1, step))
    step_size = O(lr / F64(bias_correction1))
    bc2_sqrt = O(math.sqrt(1 - math.pow(beta2, step)))
    P, g_out, G = _operands(p, g, grad_scale, maximize)
    if weight_decay != 0:
        if decoupled:
            P = (P.astype(F64) - F64(lr * weight_decay) * P.astype(F64)).astype(O)
        else:
            G = (G.astype(F64) + P.astype(F64) * F64(weight_decay)).astype(O)
    m = state["exp_avg"].astype(O)
    v = state["exp_avg_sq"].astype(O)
    m = (F64(beta1) * m.astype(F64) + F64(1 - beta1) * G.astype(F64)).astype(O)
    v = (F64(beta2) * v.astype(F64) + F64(1 - beta2) * G.astype(F64) * G.astype(F64)).astype(O)
    new = {"step": step, "exp_avg": _store(m, dtype), "exp_avg_sq": _store(v, dtype)}
    second = v
    if amsgrad:
        vmax = state["max_exp_avg_sq"].astype(O)
        vmax = np.where(vmax < v, v, vmax)
        new["max_exp_avg_sq"] = _store(vmax, dtype)
        second = vmax
    denom = ((np.sqrt(second) / bc2_sqrt).astype(F64) + F64(eps)).astype(O)
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
