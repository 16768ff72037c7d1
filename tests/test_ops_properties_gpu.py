"""Property-based tests of the GPU kernels (hypothesis), as test_ops_properties.py does for the CPU:
arbitrary shapes, dtypes, values and layouts (C order, transposed, channels-last) on CUDA tensors,
each op against its float64 reference. They reach the paths chosen by shape: the cached and
streamed row kernels, group_norm's generic and streamed kernels, the channels-last and NCHW
batch-norm kernels (and cuDNN's for the rest), the packed and per-element pool kernels."""

import os

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc.nn import _bare_ops, _spatial
import ops_reference as ref
import spatial_reference as sref
from ops_reference import assert_close, f64

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

F = ampc.nn.functional
TF = torch.nn.functional
EXAMPLES = int(os.environ.get("AMPC_PROPERTY_EXAMPLES", "60"))
# arrays of up to ~100 000 elements (a block's rows, a block per plane): large for hypothesis
SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]
DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
          np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.float64): torch.float64}
SIGNED = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # to move bits between NumPy and torch
NP_SIGNED = {2: np.int16, 4: np.int32, 8: np.int64}


def to_numpy(t, dtype):
    """A CUDA tensor's values as a NumPy array of dtype (bfloat16 through its bits)."""
    t = t.contiguous()
    return t.view(SIGNED[t.element_size()]).cpu().numpy().view(dtype)


@st.composite
def cases(draw, min_dims=1, max_dims=4, max_side=12, four_d=False):
    """(NumPy values, the same on the GPU in a C-order, transposed or channels-last layout)."""
    dtype = draw(st.sampled_from(sorted(DTYPES, key=str)))
    dims = 4 if four_d else draw(st.integers(min_dims, max_dims))
    shape = draw(hnp.array_shapes(min_dims=dims, max_dims=dims, min_side=1, max_side=max_side))
    element = st.floats(-4, 4).map(lambda v: v if abs(v) >= 1e-3 else 0.0)
    x = draw(hnp.arrays(np.float64, shape, elements=element)).astype(dtype)
    t = torch.from_numpy(x.view(NP_SIGNED[x.itemsize])).cuda().view(DTYPES[dtype])
    layout = draw(st.sampled_from(["c", "transposed", "channels_last"] if x.ndim == 4 else ["c", "transposed"]))
    if layout == "transposed" and x.ndim > 1:
        t = t.transpose(0, -1).contiguous().transpose(0, -1)
    elif layout == "channels_last":
        t = t.contiguous(memory_format=torch.channels_last)
    return x, t


UNARY = {op.name: (op.forward(F), op.reference) for op in ref.pointwise("properties")}  # ops_reference.POINTWISE


@settings(max_examples=EXAMPLES, deadline=None)
@given(cases(), st.sampled_from(sorted(UNARY)))
def test_unary_ops(case, name):
    x, t = case
    op, reference = UNARY[name]
    assert_close(to_numpy(op(t), x.dtype), reference(f64(x)), x.dtype, what=name)


@settings(max_examples=EXAMPLES, deadline=None)
@given(cases(), st.data(), st.booleans())
def test_softmax_over_any_dimension(case, data, log):
    x, t = case
    dim = data.draw(st.integers(-x.ndim, x.ndim - 1))
    op, reference = (F.log_softmax, ref.log_softmax) if log else (F.softmax, ref.softmax)
    expected = reference(f64(x), dim)
    assert_close(to_numpy(op(t, dim), x.dtype), expected, x.dtype, scale=np.abs(expected).max() if log else None,
                 what="log_softmax" if log else "softmax")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=SLOW_DATA)
@given(cases(max_dims=3, max_side=40), st.data())
def test_layer_norm_over_trailing_dimensions(case, data):
    x, t = case
    k = data.draw(st.integers(1, x.ndim))
    nshape = x.shape[x.ndim - k:]
    w = np.linspace(0.5, 1.5, int(np.prod(nshape))).reshape(nshape).astype(x.dtype)
    tw = torch.from_numpy(w.view(NP_SIGNED[w.itemsize])).cuda().view(DTYPES[x.dtype])
    expected = ref.layer_norm(f64(x), k, f64(w), None)
    assert_close(to_numpy(F.layer_norm(t, nshape, tw), x.dtype), expected, x.dtype, rtol=2 * ref.RTOL[x.dtype],
                 scale=1.5, what="layer_norm")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=SLOW_DATA)
@given(cases(four_d=True, max_side=18).filter(lambda c: c[0].shape[0] * c[0].shape[2] * c[0].shape[3] > 1))
def test_batch_norm_training(case):
    """Forward and backward against torch's float64 autograd: NCHW planes of 16 elements or more and
    channels-last whole packs take ampc's kernels, the rest cuDNN."""
    x, t = case
    c = x.shape[1]
    acc = torch.float64 if x.dtype == np.float64 else torch.float32
    w = torch.linspace(0.5, 1.5, c, device="cuda", dtype=acc)
    b = torch.linspace(-1, 1, c, device="cuda", dtype=acc)
    y, mean, rstd = _spatial.batch_norm_forward(t, None, None, w, b, True)
    xd = torch.from_numpy(f64(x)).cuda().requires_grad_(True)
    want = TF.batch_norm(xd, None, None, w.double(), b.double(), training=True)
    assert_close(to_numpy(y, x.dtype), want.detach().cpu().numpy(), x.dtype, rtol=4 * ref.RTOL[x.dtype],
                 scale=float(want.detach().abs().max()), what="batch_norm")
    gt = torch.linspace(-2, 2, x.size, device="cuda", dtype=torch.float64).reshape(x.shape).to(DTYPES[x.dtype])
    (egi,) = torch.autograd.grad(want, xd, gt.double())  # the float64 gradient for the rounded grad_output
    if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        gt = gt.contiguous(memory_format=torch.channels_last)  # the gradient in the input's layout
    gi, _, _ = F.batch_norm_backward(gt, t, w, training=True, save_mean=mean, save_rstd=rstd)
    assert_close(to_numpy(gi, x.dtype), egi.cpu().numpy(), x.dtype, rtol=8 * ref.RTOL[x.dtype],
                 scale=float(egi.abs().max()) + float(rstd.max()) * 2, what="batch_norm grad_input")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=SLOW_DATA)
@given(cases(four_d=True, max_side=12), st.data())
def test_group_norm(case, data):
    """Forward and backward (input, weight and bias) against torch's float64 autograd, over groups of
    any size: channels that are whole 16-byte packs take the streamed kernels, the rest the generic
    ones. Groups whose values barely spread are left to the fixed tests (their gradients cancel)."""
    x, t = case
    c = x.shape[1]
    groups = data.draw(st.sampled_from([d for d in range(1, c + 1) if c % d == 0]))
    assume((f64(x).reshape(x.shape[0], groups, -1).var(-1) > 1e-2).all())
    w = torch.linspace(0.5, 1.5, c, device="cuda", dtype=torch.float64).to(t.dtype)
    b = torch.linspace(-1, 1, c, device="cuda", dtype=torch.float64).to(t.dtype)
    y, mean, rstd = _bare_ops.group_norm_forward(t, groups, w, b)
    xd, wd, bd = (torch.from_numpy(f64(x)).cuda().requires_grad_(True), w.double().requires_grad_(True),
                  b.double().requires_grad_(True))
    want = TF.group_norm(xd, groups, wd, bd)
    assert_close(to_numpy(y, x.dtype), want.detach().cpu().numpy(), x.dtype, rtol=4 * ref.RTOL[x.dtype],
                 scale=1.5, what="group_norm")
    gt = torch.linspace(-2, 2, x.size, device="cuda", dtype=torch.float64).reshape(x.shape).to(t.dtype)
    egi, egw, egb = torch.autograd.grad(want, (xd, wd, bd), gt.double())
    gi, gw, gb = F.group_norm_backward(gt, t, groups, w, b, mean=mean, rstd=rstd)
    assert_close(to_numpy(gi, x.dtype), egi.cpu().numpy(), x.dtype, rtol=8 * ref.RTOL[x.dtype],
                 scale=float(egi.abs().max()) + float(rstd.max()) * 2, what="group_norm grad_input")
    terms = float(gt.double().abs().sum()) / c * 3  # |dy * xhat| summed over a channel's elements
    assert_close(to_numpy(gw, x.dtype), egw.cpu().numpy(), x.dtype, rtol=8 * ref.RTOL[x.dtype], scale=terms,
                 what="group_norm grad_weight")
    assert_close(to_numpy(gb, x.dtype), egb.cpu().numpy(), x.dtype, rtol=8 * ref.RTOL[x.dtype], scale=terms,
                 what="group_norm grad_bias")


@settings(max_examples=EXAMPLES, deadline=None)
@given(cases(four_d=True, max_side=9), st.data())
def test_pools(case, data):
    x, t = case
    h, w = x.shape[2:]
    k = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    pad = (data.draw(st.integers(0, k[0] // 2)), data.draw(st.integers(0, k[1] // 2)))
    ceil, include = data.draw(st.booleans()), data.draw(st.booleans())
    y, idx = F.max_pool2d(t, k, stride, pad, 1, ceil, return_indices=True)
    want, _ = sref.max_pool2d(f64(x), k, stride, pad, (1, 1), ceil)
    np.testing.assert_array_equal(f64(to_numpy(y, x.dtype)), want)  # a maximum is one of the inputs
    assert_close(to_numpy(F.avg_pool2d(t, k, stride, pad, ceil, include), x.dtype),
                 sref.avg_pool2d(f64(x), k, stride, pad, ceil, include), x.dtype, rtol=2 * ref.RTOL[x.dtype],
                 what="avg_pool2d")
    size = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    assert_close(to_numpy(F.adaptive_avg_pool2d(t, size), x.dtype), sref.adaptive_avg_pool2d(f64(x), size), x.dtype,
                 rtol=2 * ref.RTOL[x.dtype], what="adaptive_avg_pool2d")
