"""ampc.nn.functional's spatial ops on the CPU (conv2d, conv1d, batch_norm, max/avg/adaptive
pooling): forward and backward against float64 references on fresh random data in float32,
float16, bfloat16 and float64 (odd sizes, size 1, strided inputs), backward also against float64
finite differences; dtypes under autocast; bad input."""

import os
import subprocess
import sys

import numpy as np
import pytest

import ampc
from ampc.nn import _spatial
import ops_reference as ref
import spatial_reference as sref
from ops_reference import BF16, F16, F32, F64, FLOATS, assert_close, f64, numeric_grad

F = ampc.nn.functional


@pytest.fixture
def rng(test_seed):
    return np.random.default_rng(test_seed)


def strided(x):
    """The same values in a non-contiguous layout (every other column of a wider array, NaN in
    the gaps)."""
    wide = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


# (N, C, H, W, K, R, S, stride, padding, dilation, groups)
CONVS = [
    (2, 3, 7, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1),
    (3, 4, 9, 8, 6, 3, 2, (2, 1), (1, 0), (1, 2), 2),
    (1, 6, 5, 5, 6, 1, 1, (1, 1), (0, 0), (1, 1), 6),      # depthwise 1x1
    (2, 5, 11, 4, 3, 5, 3, (3, 2), (2, 1), (1, 1), 1),
    (1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1), 1),      # size 1 everywhere
    (2, 8, 6, 7, 8, 3, 3, (1, 1), (1, 1), (2, 2), 4),
    (2, 6, 5, 7, 4, 1, 1, (1, 1), (0, 0), (1, 1), 2),      # 1x1, stride 1: x is its own columns
    (2, 4, 7, 9, 5, 1, 1, (2, 2), (0, 0), (1, 1), 1),      # 1x1 strided: lowered
    (1, 2, 4, 5, 3, 2, 2, (1, 2), (3, 3), (1, 1), 1),      # output rows and columns wholly in the padding
]


def conv_case(rng, case, dtype):
    n, c, h, w, k, r, s, stride, pad, dil, groups = case
    x = ref.random(rng, (n, c, h, w), dtype)
    wt = ref.random(rng, (k, c // groups, r, s), dtype, scale=0.5)
    b = ref.random(rng, (k,), dtype)
    return x, wt, b, dict(stride=stride, padding=pad, dilation=dil, groups=groups)


def conv_scale(x, wt, groups):
    """The magnitude of the sums a convolution output adds up (for the tolerance)."""
    return float(np.abs(f64(x)).max() * np.abs(f64(wt)).sum(axis=(1, 2, 3)).max()) + 1.0


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d_forward(rng, case, dtype):
    x, wt, b, kw = conv_case(rng, case, dtype)
    before = x.copy()
    expect = sref.conv2d(x, wt, b, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    scale = conv_scale(x, wt, kw["groups"])
    assert_close(F.conv2d(x, wt, b, **kw), expect, dtype, scale=scale, what="conv2d")
    assert_close(F.conv2d(strided(x), wt, b, **kw), expect, dtype, scale=scale, what="conv2d strided input")
    no_bias = sref.conv2d(x, wt, None, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    assert_close(F.conv2d(x, wt, None, **kw), no_bias, dtype, scale=scale, what="conv2d without bias")
    np.testing.assert_array_equal(x.view(np.uint8), before.view(np.uint8))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", CONVS, ids=str)
def test_conv2d_backward(rng, case, dtype):
    x, wt, _, kw = conv_case(rng, case, dtype)
    y = F.conv2d(x, wt, None, **kw)
    dy = ref.random(rng, y.shape, dtype)
    gi, gw, gb = F.conv2d_backward(dy, x, wt, **kw)
    egi, egw, egb = sref.conv2d_grads(dy, x, wt, kw["stride"], kw["padding"], kw["dilation"], kw["groups"])
    scale = float(np.abs(f64(dy)).max() * max(np.abs(f64(wt)).sum(), np.abs(f64(x)).sum() / x.shape[1]) + 1.0)
    assert_close(gi, egi, dtype, scale=scale, what="grad_input")
    assert_close(gw, egw, dtype, scale=scale, what="grad_weight")
    assert_close(gb, egb, dtype, scale=float(np.abs(f64(dy)).sum()), what="grad_bias")
    gi2, gw2, _ = F.conv2d_backward(strided(dy), strided(x), wt, **kw)
    assert_close(gi2, egi, dtype, scale=scale, what="grad_input from strided arrays")
    assert_close(gw2, egw, dtype, scale=scale, what="grad_weight from strided arrays")


@pytest.mark.parametrize("case", CONVS[:4], ids=str)
def test_conv2d_backward_finite_differences(rng, case):
    x, wt, b, kw = conv_case(rng, case, F64)
    dy = rng.standard_normal(F.conv2d(x, wt, b, **kw).shape)
    gi, gw, gb = F.conv2d_backward(dy, x, wt, **kw)
    np.testing.assert_allclose(gi, numeric_grad(lambda v: F.conv2d(v, wt, b, **kw), x.copy(), dy), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(gw, numeric_grad(lambda v: F.conv2d(x, v, b, **kw), wt.copy(), dy), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(gb, numeric_grad(lambda v: F.conv2d(x, wt, v, **kw), b.copy(), dy), rtol=1e-6,
                               atol=1e-7)


def test_conv2d_chunks_many_images(rng):
    """More images than fit one chunk of columns: the chunks must meet exactly."""
    x = ref.random(rng, (40, 16, 40, 40), F32)
    wt = ref.random(rng, (8, 16, 3, 3), F32, scale=0.2)
    y = F.conv2d(x, wt, None, padding=1)
    assert_close(y, sref.conv2d(x, wt, None, (1, 1), (1, 1)), F32, scale=conv_scale(x, wt, 1))
    dy = ref.random(rng, y.shape, F32)
    gi, gw, _ = F.conv2d_backward(dy, x, wt, padding=1, bias_grad=False)
    egi, egw, _ = sref.conv2d_grads(dy, x, wt, (1, 1), (1, 1))
    assert_close(gi, egi, F32, scale=float(np.abs(egi).max()), what="grad_input")
    assert_close(gw, egw, F32, rtol=1e-4, scale=float(np.abs(egw).max()), what="grad_weight over 64000 positions")


def test_pointwise_conv2d_chunks_many_images(rng):
    """A 1x1 filter (stride 1, no padding) multiplies x itself and writes dx directly, a chunk of
    images at a time: more images than one chunk holds, every chunk's offsets right."""
    x = ref.random(rng, (30, 512, 24, 24), F32)
    wt = ref.random(rng, (6, 512, 1, 1), F32, scale=0.05)
    b = ref.random(rng, (6,), F32)
    y = F.conv2d(x, wt, b)
    assert_close(y, sref.conv2d(x, wt, b, (1, 1), (0, 0)), F32, scale=conv_scale(x, wt, 1))
    dy = ref.random(rng, y.shape, F32)
    gi, gw, _ = F.conv2d_backward(dy, x, wt, bias_grad=False)
    egi, egw, _ = sref.conv2d_grads(dy, x, wt, (1, 1), (0, 0))
    assert_close(gi, egi, F32, scale=float(np.abs(egi).max()), what="grad_input")
    assert_close(gw, egw, F32, rtol=1e-4, scale=float(np.abs(egw).max()), what="grad_weight over 17280 positions")


def test_conv2d_threads_do_not_change_bits(rng):
    x = ref.random(rng, (6, 8, 17, 13), F16)
    wt = ref.random(rng, (12, 8, 3, 3), F16)
    dy = ref.random(rng, (6, 12, 17, 13), F16)
    old = ampc.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            ampc.set_num_threads(threads)
            results.append([F.conv2d(x, wt, None, padding=1)] + list(F.conv2d_backward(dy, x, wt, padding=1)))
    finally:
        ampc.set_num_threads(old)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_conv2d_unbatched_and_padding_strings(rng):
    x = ref.random(rng, (3, 8, 9), F32)
    wt = ref.random(rng, (5, 3, 3, 3), F32)
    y = F.conv2d(x, wt, padding="same")
    assert y.shape == (5, 8, 9)
    assert_close(y, sref.conv2d(x[None], wt, None, (1, 1), (1, 1))[0], F32, scale=conv_scale(x, wt, 1))
    assert F.conv2d(x, wt, padding="valid").shape == (5, 6, 7)
    with pytest.raises(ValueError, match="strided"):
        F.conv2d(x, wt, stride=2, padding="same")


@pytest.mark.parametrize("kernel,dilation", [((2, 4), (1, 1)), ((2, 3), (3, 1)), ((4, 2), (1, 2))])
def test_conv2d_same_padding_with_an_even_kernel(rng, kernel, dilation):
    """torch's asymmetric 'same': total padding d * (k - 1), half before, the rest after; the
    gradients as those of a convolution of the input padded that way."""
    x = ref.random(rng, (2, 3, 7, 8), F64)
    wt = ref.random(rng, (4, 3) + kernel, F64)
    totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
    before = [t // 2 for t in totals]
    padded = np.pad(x, ((0, 0), (0, 0), (before[0], totals[0] - before[0]), (before[1], totals[1] - before[1])))
    y = F.conv2d(x, wt, padding="same", dilation=dilation)
    assert y.shape == (2, 4, 7, 8)
    want = F.conv2d(padded, wt, dilation=dilation)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)
    dy = ref.random(rng, y.shape, F64)
    gi, gw, gb = F.conv2d_backward(dy, x, wt, padding="same", dilation=dilation)
    pi, pw, pb = F.conv2d_backward(dy, padded, wt, dilation=dilation)
    window = pi[:, :, before[0]:before[0] + 7, before[1]:before[1] + 8]
    np.testing.assert_allclose(gi, window, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, pw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gb, pb, rtol=1e-12, atol=1e-12)
    y1 = F.conv1d(x[:, :, 0], wt[:, :, 0], padding="same", dilation=dilation[1])  # conv1d too
    np.testing.assert_allclose(y1, F.conv1d(padded[:, :, before[0], :], wt[:, :, 0], dilation=dilation[1]),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_conv1d(rng, dtype):
    x = ref.random(rng, (2, 6, 19), dtype)
    wt = ref.random(rng, (4, 3, 5), dtype, scale=0.5)
    b = ref.random(rng, (4,), dtype)
    kw = dict(stride=2, padding=3, dilation=2, groups=2)
    expect = sref.conv2d(x[:, :, None], wt[:, :, None], b, (1, 2), (0, 3), (1, 2), 2)[:, :, 0]
    y = F.conv1d(x, wt, b, **kw)
    assert_close(y, expect, dtype, scale=conv_scale(x[:, :, None], wt[:, :, None], 2), what="conv1d")
    dy = ref.random(rng, y.shape, dtype)
    gi, gw, gb = F.conv1d_backward(dy, x, wt, **kw)
    egi, egw, egb = sref.conv2d_grads(dy[:, :, None], x[:, :, None], wt[:, :, None], (1, 2), (0, 3), (1, 2), 2)
    scale = float(np.abs(f64(dy)).max() * (np.abs(f64(wt)).sum() + np.abs(f64(x)).sum()))
    assert_close(gi, egi[:, :, 0], dtype, scale=scale, what="conv1d grad_input")
    assert_close(gw, egw[:, :, 0], dtype, scale=scale, what="conv1d grad_weight")
    assert gb.shape == (4,)
    assert F.conv1d(x[0], wt, b, **kw).shape == y.shape[1:]


def test_conv1d_messages_show_its_own_shapes(rng):
    """conv1d runs as conv2d over one-row images; its refusals name conv1d and show 1-D shapes
    (torch's texts), not the 2-D op's with the inserted dimension."""
    x = ref.random(rng, (2, 3, 4), F32)
    for call, message in [
            (lambda: F.conv1d(x, np.ones((4, 3, 6), F32)), r"conv1d: Calculated padded input size per channel: \(4\)\. "
                                                            r"Kernel size: \(6\)\."),
            (lambda: F.conv1d(x, np.ones((4, 2, 3), F32)), r"conv1d: Given groups=1, weight of size \[4, 2, 3\], "
                                                            r"expected input\[2, 3, 4\] to have 2 channels"),
            (lambda: F.conv1d(x, np.ones((5, 3, 3), F32), groups=2), r"conv1d: Given groups=2, expected weight to be "
                                                                      r"divisible by 2 at dimension 0, but got weight "
                                                                      r"of size \[5, 3, 3\]"),
            (lambda: F.conv1d_backward(np.ones((2, 4, 3), F32), x, np.ones((4, 3, 3), F32)),
             r"conv1d_backward: grad_output must have the output's shape \[2, 4, 2\], got \[2, 4, 3\]")]:
        with pytest.raises(ValueError, match=message):
            call()


def test_conv_under_autocast_runs_in_lower_precision(rng):
    x = ref.random(rng, (2, 3, 8, 8), F32)
    wt = ref.random(rng, (4, 3, 3, 3), F32)
    b = ref.random(rng, (4,), F32)
    with ampc.autocast("cpu"):
        y = F.conv2d(x, wt, b, padding=1)
        y1 = F.conv1d(x[:, :, 0], wt[:, :, 0], b, padding=1)
    assert y.dtype == BF16 and y1.dtype == BF16
    # the same bits as casting by hand first: one rounding of float32 sums
    expect = F.conv2d(x.astype(BF16), wt.astype(BF16), b.astype(BF16), padding=1)
    np.testing.assert_array_equal(y.view(np.uint16), expect.view(np.uint16))


def test_conv2d_bad_input(rng):
    x = ref.random(rng, (2, 4, 6, 6), F32)
    wt = ref.random(rng, (6, 2, 3, 3), F32)
    with pytest.raises(ValueError, match="expected input\\[2, 4, 6, 6\\] to have 2 channels"):
        F.conv2d(x, wt)
    with pytest.raises(ValueError, match="divisible by 4"):
        F.conv2d(x, wt, groups=4)
    with pytest.raises(ValueError, match="non-positive groups"):
        F.conv2d(x, wt, groups=0)
    with pytest.raises(TypeError, match="same dtype"):
        F.conv2d(x, wt.astype(F16), groups=2)
    with pytest.raises(TypeError, match="floating"):
        F.conv2d(x.astype(np.int32), wt, groups=2)
    with pytest.raises(ValueError, match="bias to be 1-dimensional with 6 elements"):
        F.conv2d(x, wt, np.zeros(5, F32), groups=2)
    with pytest.raises(ValueError, match="Kernel size can't be greater"):
        F.conv2d(x, ref.random(rng, (6, 4, 9, 9), F32))
    with pytest.raises(ValueError, match="stride must be positive"):
        F.conv2d(x, wt, stride=0, groups=2)
    with pytest.raises(ValueError, match="padding must be non-negative"):
        F.conv2d(x, wt, padding=-1, groups=2)
    with pytest.raises(ValueError, match="Expected 3D \\(unbatched\\) or 4D"):
        F.conv2d(x[0, 0], wt)
    with pytest.raises(ValueError, match="grad_output must have the output's shape"):
        F.conv2d_backward(np.zeros((2, 6, 3, 3), F32), x, wt, groups=2)


def test_convolutions_print_the_lines_cuda_kept(rng, monkeypatch, capsys):
    """ampc._cuda keeps AMPC_CONV_DEBUG's lines instead of printing them (nothing in C prints); each
    convolution call prints on sys.stderr what _C._cuda_conv_report hands it after the call, a
    failing call's too (the GPU test_conv_debug_lines_reach_python checks the lines themselves)."""
    taken = ["ampc conv: 1\n", "", "ampc conv: 2\nampc conv: 3\n", "ampc conv: 4\n", "ampc conv: 5\n", "",
             "ampc conv: a failed call's\n"]
    monkeypatch.setattr(_spatial._C, "_cuda_conv_report", lambda: taken.pop(0))
    x, wt = ref.random(rng, (2, 4, 6, 6), F32), ref.random(rng, (6, 2, 3, 3), F32)
    F.conv2d(x, wt, groups=2)
    assert capsys.readouterr().err == "ampc conv: 1\n"
    F.conv2d(x, wt, groups=2)
    assert capsys.readouterr().err == ""
    F.conv2d_backward(np.zeros((2, 6, 4, 4), F32), x, wt, groups=2)  # the data, then the filter gradient
    assert capsys.readouterr().err == "ampc conv: 2\nampc conv: 3\nampc conv: 4\n"
    F.conv1d(x[:, :, 0], wt[:, :, 0], groups=2)
    assert capsys.readouterr().err == "ampc conv: 5\n"
    F.conv1d(x[:, :, 0], wt[:, :, 0], groups=2)
    with pytest.raises(ValueError, match="to have 2 channels"):
        F.conv2d(x, wt)
    assert capsys.readouterr().err == "ampc conv: a failed call's\n" and taken == []


# --------------------------------------------------------------------------------------------
# Batch norm
# --------------------------------------------------------------------------------------------

BN_SHAPES = [(4, 3, 5, 6), (7, 5), (3, 4, 9), (2, 1, 3, 3), (5, 2, 2, 3, 2)]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", BN_SHAPES, ids=str)
def test_batch_norm_training(rng, shape, dtype):
    acc = F64 if dtype == F64 else F32
    x = ref.random(rng, shape, dtype, scale=3.0) + dtype.type(1.5)
    c = shape[1]
    w, b = ref.random(rng, (c,), acc), ref.random(rng, (c,), acc)
    rm, rv = ref.random(rng, (c,), acc), np.abs(ref.random(rng, (c,), acc)) + 0.5
    rm0, rv0 = rm.copy(), rv.copy()
    y, mean, rstd = _spatial.batch_norm_forward(x, rm, rv, w, b, True, 0.1, 1e-5)
    m, v, vu = sref.batch_stats(x)
    assert_close(y, sref.batch_norm(x, m, v, w, b), dtype, what="batch_norm output")
    assert_close(mean, m, acc, scale=float(np.abs(f64(x)).max()), what="save_mean")
    assert_close(rstd, 1 / np.sqrt(v + 1e-5), acc, rtol=1e-5 if acc == F32 else 1e-10, what="save_rstd")
    assert_close(rm, 0.9 * f64(rm0) + 0.1 * m, acc, scale=float(np.abs(m).max()), what="running_mean")
    assert_close(rv, 0.9 * f64(rv0) + 0.1 * vu, acc, rtol=1e-5 if acc == F32 else 1e-10, what="running_var")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_batch_norm_eval_and_16bit_running_stats(rng, dtype):
    x = ref.random(rng, (3, 4, 5, 2), dtype)
    rm, rv = ref.random(rng, (4,), F32), np.abs(ref.random(rng, (4,), F32)) + 0.5
    w = ref.random(rng, (4,), dtype)
    y = F.batch_norm(x, rm, rv, w, None, training=False, eps=1e-3)
    assert_close(y, sref.batch_norm(x, f64(rm), f64(rv), w, None, 1e-3), dtype, what="eval batch_norm")
    # running statistics of another dtype are updated in place, rounded once
    rm16, rv16 = rm.astype(F16), rv.astype(F16)
    F.batch_norm(x, rm16, rv16, None, None, training=True, momentum=0.5)
    m, _, vu = sref.batch_stats(x)
    assert_close(rm16, 0.5 * f64(rm.astype(F16)) + 0.5 * m, F16, scale=1.0, rtol=2**-9, what="float16 running_mean")
    assert_close(rv16, 0.5 * f64(rv.astype(F16)) + 0.5 * vu, F16, rtol=2**-9, what="float16 running_var")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 2), (3, 2, 7)], ids=str)
def test_batch_norm_backward(rng, shape, dtype):
    acc = F64 if dtype == F64 else F32
    x = ref.random(rng, shape, dtype)
    c = shape[1]
    w, b = ref.random(rng, (c,), acc), ref.random(rng, (c,), acc)
    dy = ref.random(rng, shape, dtype)
    gi, gw, gb = F.batch_norm_backward(dy, x, w, training=True)
    # the analytic reference in float64
    dims = (0,) + tuple(range(2, len(shape)))
    bshape = (1, -1) + (1,) * (len(shape) - 2)
    xd, dyd = f64(x), f64(dy)
    m, v = xd.mean(axis=dims), xd.var(axis=dims)
    rstd = 1 / np.sqrt(v + 1e-5)
    xhat = (xd - m.reshape(bshape)) * rstd.reshape(bshape)
    egb, egw = dyd.sum(axis=dims), (dyd * xhat).sum(axis=dims)
    cnt = xd.size / c
    egi = (f64(w) * rstd).reshape(bshape) * (dyd - (egb / cnt).reshape(bshape) - xhat * (egw / cnt).reshape(bshape))
    assert_close(gi, egi, dtype, scale=float(np.abs(egi).max()) * 4, what="grad_input")
    assert_close(gw, egw, acc, scale=float(np.abs(dyd).sum()) * 1e-2, what="grad_weight")
    assert_close(gb, egb, acc, scale=float(np.abs(dyd).sum()) * 1e-2, what="grad_bias")


def test_batch_norm_backward_finite_differences(rng):
    x = rng.standard_normal((3, 2, 4))
    w, b = rng.standard_normal(2), rng.standard_normal(2)
    dy = rng.standard_normal(x.shape)
    for training in (True, False):
        rm, rv = rng.standard_normal(2), np.abs(rng.standard_normal(2)) + 0.5

        def f(xv, wv=w, bv=b):
            return F.batch_norm(xv, rm.copy(), rv.copy(), wv, bv, training=training)

        gi, gw, gb = F.batch_norm_backward(dy, x, w, rm, rv, training=training)
        np.testing.assert_allclose(gi, numeric_grad(f, x.copy(), dy), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(gw, numeric_grad(lambda v: f(x, v), w.copy(), dy), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(gb, numeric_grad(lambda v: f(x, w, v), b.copy(), dy), rtol=1e-6, atol=1e-8)


def test_batch_norm_bad_input(rng):
    x = ref.random(rng, (4, 3, 2), F32)
    rm, rv = np.zeros(3, F32), np.ones(3, F32)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        F.batch_norm(x[:1, :, :1], rm, rv, training=True)
    with pytest.raises(ValueError, match="must be defined in evaluation mode"):
        F.batch_norm(x, None, None, training=False)
    with pytest.raises(ValueError, match="one value per channel"):
        F.batch_norm(x, np.zeros(2, F32), rv, training=True)
    readonly = rm.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        F.batch_norm(x, readonly, rv, training=True)
    with pytest.raises(TypeError, match="floating"):
        F.batch_norm(x.astype(np.int64), rm, rv)
    np.testing.assert_array_equal(rm, 0)
    np.testing.assert_array_equal(rv, 1)


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------

# (shape, kernel, stride, padding, dilation, ceil_mode)
MAX_POOLS = [
    ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), (1, 1), False),
    ((1, 2, 7, 7), (2, 3), (2, 1), (1, 0), (2, 1), True),
    ((3, 5, 6), (2, 2), (2, 2), (0, 0), (1, 1), True),
    ((1, 1, 1, 1), (1, 1), (1, 1), (0, 0), (1, 1), False),
    ((2, 2, 11, 5), (3, 2), (3, 2), (1, 1), (1, 2), True),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", MAX_POOLS, ids=str)
def test_max_pool2d(rng, case, dtype):
    shape, k, s, p, d, ceil = case
    x = ref.random(rng, shape, dtype)
    y, idx = F.max_pool2d(x, k, s, p, d, ceil, return_indices=True)
    ey, eidx = sref.max_pool2d(x, k, s, p, d, ceil)
    assert_close(y, ey, dtype, rtol=0, what="max_pool2d")
    np.testing.assert_array_equal(idx, eidx)
    dy = ref.random(rng, y.shape, dtype)
    gi = F.max_pool2d_backward(dy, x, idx, k, s, p, d, ceil)
    egi = np.zeros((int(np.prod(shape[:-2])), shape[-2] * shape[-1]))
    for plane, (ids, g) in enumerate(zip(eidx.reshape(len(egi), -1), f64(dy).reshape(len(egi), -1))):
        np.add.at(egi[plane], ids, g)
    assert_close(gi, egi.reshape(shape), dtype, scale=float(np.abs(f64(dy)).max()), what="max_pool2d backward")
    y2 = F.max_pool2d(strided(x), k, s, p, d, ceil)
    np.testing.assert_array_equal(np.asarray(y2).view(np.uint8), np.asarray(y).view(np.uint8))


def test_max_pool2d_nan_wins():
    x = np.array([[[[1.0, np.nan], [3.0, 2.0]]]], np.float32)
    y, idx = F.max_pool2d(x, 2, return_indices=True)
    assert np.isnan(y[0, 0, 0, 0]) and idx[0, 0, 0, 0] == 1


AVG_POOLS = [
    ((2, 3, 9, 8), (3, 3), (2, 2), (1, 1), False, True, None),
    ((1, 2, 7, 7), (2, 3), (2, 1), (1, 1), True, False, None),
    ((3, 5, 6), (2, 2), (2, 2), (1, 0), True, True, None),
    ((2, 2, 5, 5), (3, 3), (1, 1), (1, 1), False, True, 4),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", AVG_POOLS, ids=str)
def test_avg_pool2d(rng, case, dtype):
    shape, k, s, p, ceil, include, divisor = case
    x = ref.random(rng, shape, dtype)
    kw = dict(ceil_mode=ceil, count_include_pad=include, divisor_override=divisor)
    y = F.avg_pool2d(x, k, s, p, **kw)
    assert_close(y, sref.avg_pool2d(x, k, s, p, ceil, include, divisor), dtype, what="avg_pool2d")
    xd = f64(x)
    dy = rng.standard_normal(y.shape)
    gi = F.avg_pool2d_backward(dy, xd, k, s, p, **kw)
    np.testing.assert_allclose(gi, numeric_grad(lambda v: F.avg_pool2d(v, k, s, p, **kw), xd.copy(), dy),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,size", [((2, 3, 7, 7), (1, 1)), ((1, 2, 9, 5), (4, 3)), ((3, 5, 6), (5, 6)),
                                        ((2, 2, 4, 4), (None, 2))], ids=str)
def test_adaptive_avg_pool2d(rng, shape, size, dtype):
    x = ref.random(rng, shape, dtype)
    y = F.adaptive_avg_pool2d(x, size)
    full = tuple(shape[-2 + i] if s is None else s for i, s in enumerate(size))
    assert_close(y, sref.adaptive_avg_pool2d(x, full), dtype, what="adaptive_avg_pool2d")
    xd = f64(x)
    dy = rng.standard_normal(y.shape)
    gi = F.adaptive_avg_pool2d_backward(dy, xd)
    np.testing.assert_allclose(gi, numeric_grad(lambda v: F.adaptive_avg_pool2d(v, size), xd.copy(), dy),
                               rtol=1e-6, atol=1e-8)


def test_pool_bad_input(rng):
    x = ref.random(rng, (2, 3, 4, 4), F32)
    with pytest.raises(ValueError, match="pad should be at most half"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(ValueError, match="Output size is too small"):
        F.max_pool2d(x, 5)
    with pytest.raises(ValueError, match="divisor must be not zero"):
        F.avg_pool2d(x, 2, divisor_override=0)
    with pytest.raises(ValueError, match="3-D \\(unbatched\\) or 4-D"):
        F.max_pool2d(x[0, 0], 2)
    with pytest.raises(TypeError, match="int64"):
        F.max_pool2d_backward(np.zeros((2, 3, 2, 2), F32), x, np.zeros((2, 3, 2, 2), np.int32), 2)
    with pytest.raises(ValueError, match="output shape"):
        F.avg_pool2d_backward(np.zeros((2, 3, 3, 3), F32), x, 2)


def set_and_refuse(name, value):
    """Set ampc.backends.cudnn's switch name to value, then check that what is no bool is a TypeError
    that leaves it as it was."""
    cudnn = ampc.backends.cudnn
    setattr(cudnn, name, value)
    assert getattr(cudnn, name) is value
    for bad in (1, 0, "yes", None, np.True_, np.False_):
        with pytest.raises(TypeError, match=f"cudnn.{name}: expected a bool"):
            setattr(cudnn, name, bad)
        assert getattr(cudnn, name) is value


def test_cudnn_benchmark_switch():
    """ampc.backends.cudnn.benchmark: True by default (ampc times cuDNN's algorithms on a shape's
    first call), False by AMPC_CUDNN_BENCHMARK=0 (a fresh process reads it), a bool set
    process-wide. (What it does is test_spatial_gpu's.)"""
    assert ampc.backends.cudnn.benchmark is True
    try:
        set_and_refuse("benchmark", False)
    finally:
        ampc.backends.cudnn.benchmark = True
    code = "import ampc; print(ampc.backends.cudnn.benchmark)"
    for env, want in (("0", "False"), ("1", "True")):
        out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, AMPC_CUDNN_BENCHMARK=env),
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == want, env


def test_cudnn_deterministic_switch():
    """ampc.backends.cudnn.deterministic, as torch's: False by default, a bool set process-wide.
    (What it does is test_spatial_gpu's.)"""
    cudnn = ampc.backends.cudnn
    assert cudnn.deterministic is False
    try:
        set_and_refuse("deterministic", True)
        # the CPU's convolutions have one algorithm: the switch changes nothing there
        rng = np.random.default_rng(5)
        x, w = rng.standard_normal((2, 3, 6, 6), dtype=np.float32), rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
        on = ampc.nn.functional.conv2d(x, w, padding=1)
        cudnn.deterministic = False
        np.testing.assert_array_equal(ampc.nn.functional.conv2d(x, w, padding=1), on)
    finally:
        cudnn.deterministic = False
    assert cudnn.deterministic is False


@pytest.mark.parametrize("call", [
    lambda x, w: F.conv2d(x, w, padding=2**62),            # h + 2 pad wrapped: "padded size -9223372036854775804"
    lambda x, w: F.conv2d(x, w, dilation=(2**62, 1)),      # dilation * (r - 1) wrapped
    lambda x, w: F.conv2d(x[:0], w, padding=2**40),        # no image: p * q * crs of a column block wrapped
    lambda x, w: F.max_pool2d(x, 3, dilation=2**62),       # "Calculated output size: (-3074457345618258601x...)"
    lambda x, w: F.max_pool2d(x, 2**62, padding=2**61, dilation=4),
    lambda x, w: F.avg_pool2d(x, 3, stride=2**63 - 1, ceil_mode=True),
    lambda x, w: F.adaptive_avg_pool2d(x, (2**62, 4)),     # a window's (i + 1) * h
], ids=["conv-padding", "conv-dilation", "conv-empty-batch", "pool-dilation", "pool-kernel", "pool-stride",
        "adaptive-output"])
def test_sizes_past_int64_are_a_clear_value_error(call):
    """Padding, dilation, stride, kernel and output sizes whose arithmetic passes int64 (issue 50's
    size-arithmetic hunt): one ValueError saying so, never a size that wrapped."""
    x, w = np.ones((2, 1, 4, 4), F32), np.ones((1, 1, 3, 3), F32)
    with pytest.raises(ValueError, match="too large") as raised:
        call(x, w)
    assert "-" not in str(raised.value).split(":", 1)[1]  # no wrapped (negative) size in the message
