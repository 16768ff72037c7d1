"""float64 references for the spatial ops (convolution, batch norm, pooling), written from their
definitions with plain loops and slices, not from ampc's lowering to columns."""

import math

import numpy as np


def conv_out(size, k, stride, pad, dil):
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _taps(x, w, stride, pad, dil):
    """For each filter tap (r, s): the input values it meets at every output position."""
    n, c, h, wd = x.shape
    _, _, R, S = w.shape
    p, q = conv_out(h, R, stride[0], pad[0], dil[0]), conv_out(wd, S, stride[1], pad[1], dil[1])
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    for r in range(R):
        for s in range(S):
            rows = slice(r * dil[0], r * dil[0] + stride[0] * (p - 1) + 1, stride[0])
            cols = slice(s * dil[1], s * dil[1] + stride[1] * (q - 1) + 1, stride[1])
            yield r, s, rows, cols, xp[:, :, rows, cols]


def conv2d(x, w, b=None, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1):
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    k, cg = w.shape[0], w.shape[1]
    kg = k // groups
    y = None
    for r, s, _, _, patch in _taps(x, w, stride, pad, dil):
        if y is None:
            y = np.zeros((x.shape[0], k) + patch.shape[2:])
        for g in range(groups):
            y[:, g * kg:(g + 1) * kg] += np.einsum("nchw,kc->nkhw", patch[:, g * cg:(g + 1) * cg],
                                                   w[g * kg:(g + 1) * kg, :, r, s])
    if b is not None:
        y += np.asarray(b, np.float64)[None, :, None, None]
    return y


def conv2d_grads(dy, x, w, stride=(1, 1), pad=(0, 0), dil=(1, 1), groups=1):
    """(grad_input, grad_weight, grad_bias): each tap's share scattered back by hand."""
    x, w, dy = (np.asarray(a, np.float64) for a in (x, w, dy))
    k, cg = w.shape[0], w.shape[1]
    kg = k // groups
    n, c, h, wd = x.shape
    gxp = np.zeros((n, c, h + 2 * pad[0], wd + 2 * pad[1]))
    gw = np.zeros_like(w)
    for r, s, rows, cols, patch in _taps(x, w, stride, pad, dil):
        for g in range(groups):
            dyg = dy[:, g * kg:(g + 1) * kg]
            gxp[:, g * cg:(g + 1) * cg, rows, cols] += np.einsum("nkhw,kc->nchw", dyg, w[g * kg:(g + 1) * kg, :, r, s])
            gw[g * kg:(g + 1) * kg, :, r, s] = np.einsum("nkhw,nchw->kc", dyg, patch[:, g * cg:(g + 1) * cg])
    gx = gxp[:, :, pad[0]:pad[0] + h, pad[1]:pad[1] + wd]
    return gx, gw, dy.sum(axis=(0, 2, 3))


def batch_norm(x, mean, var, w=None, b=None, eps=1e-5):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (np.asarray(x, np.float64) - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if w is not None:
        y = y * np.asarray(w, np.float64).reshape(shape)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(shape)
    return y


def batch_stats(x):
    dims = (0,) + tuple(range(2, x.ndim))
    x = np.asarray(x, np.float64)
    return x.mean(axis=dims), x.var(axis=dims), x.var(axis=dims, ddof=1)


def pool_out(size, k, stride, pad, dil, ceil_mode):
    span = size + 2 * pad - dil * (k - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def max_pool2d(x, k, stride, pad, dil, ceil_mode=False):
    """(output, flat indices) by looping over every window."""
    x = np.asarray(x, np.float64)
    h, w = x.shape[-2:]
    p, q = pool_out(h, k[0], stride[0], pad[0], dil[0], ceil_mode), pool_out(w, k[1], stride[1], pad[1], dil[1],
                                                                              ceil_mode)
    planes = x.reshape(-1, h, w)
    y = np.empty((planes.shape[0], p, q))
    idx = np.empty((planes.shape[0], p, q), np.int64)
    for i in range(p):
        for j in range(q):
            rows = [i * stride[0] - pad[0] + a * dil[0] for a in range(k[0])]
            cols = [j * stride[1] - pad[1] + b * dil[1] for b in range(k[1])]
            cells = [(r, c) for r in rows for c in cols if 0 <= r < h and 0 <= c < w]
            vals = np.stack([planes[:, r, c] for r, c in cells], axis=1)
            best = np.argmax(vals, axis=1)
            y[:, i, j] = vals[np.arange(len(best)), best]
            idx[:, i, j] = [cells[t][0] * w + cells[t][1] for t in best]
    return y.reshape(x.shape[:-2] + (p, q)), idx.reshape(x.shape[:-2] + (p, q))


def avg_pool2d(x, k, stride, pad, ceil_mode=False, count_include_pad=True, divisor=None):
    x = np.asarray(x, np.float64)
    h, w = x.shape[-2:]
    p, q = pool_out(h, k[0], stride[0], pad[0], 1, ceil_mode), pool_out(w, k[1], stride[1], pad[1], 1, ceil_mode)
    y = np.empty(x.shape[:-2] + (p, q))
    for i in range(p):
        for j in range(q):
            r0, c0 = i * stride[0] - pad[0], j * stride[1] - pad[1]
            r1, c1 = min(r0 + k[0], h + pad[0]), min(c0 + k[1], w + pad[1])
            padded = (r1 - r0) * (c1 - c0)
            r0, c0, r1, c1 = max(r0, 0), max(c0, 0), min(r1, h), min(c1, w)
            window = x[..., r0:r1, c0:c1]
            d = divisor or (padded if count_include_pad else (r1 - r0) * (c1 - c0))
            y[..., i, j] = window.sum(axis=(-2, -1)) / d
    return y


def adaptive_avg_pool2d(x, size):
    x = np.asarray(x, np.float64)
    h, w = x.shape[-2:]
    p, q = size
    y = np.empty(x.shape[:-2] + (p, q))
    for i in range(p):
        for j in range(q):
            r0, r1 = i * h // p, math.ceil((i + 1) * h / p)
            c0, c1 = j * w // q, math.ceil((j + 1) * w / q)
            y[..., i, j] = x[..., r0:r1, c0:c1].mean(axis=(-2, -1))
    return y
