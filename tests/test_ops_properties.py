"""Property-based tests of ampc.nn.functional's CPU kernels (hypothesis): for arbitrary shapes,
memory layouts (C order, transposed, stepped, reversed), dtypes and values, each op against its
float64 reference within the tolerance the dtype's rounding allows, with the input left as it was.
test_ops.py checks chosen cases; these search for the shape or layout that breaks a kernel.

    AMPC_PROPERTY_EXAMPLES=5000 python -m pytest tests/test_ops_properties.py   # a longer search"""

import math
import os

import numpy as np
import pytest

import ampc
import ops_reference as ref
import spatial_reference as sref
from ops_reference import F64, FLOATS, assert_close, f64

pytest.importorskip("hypothesis")
from hypothesis import assume, given, settings, strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

F = ampc.nn.functional
EXAMPLES = int(os.environ.get("AMPC_PROPERTY_EXAMPLES", "150"))  # a longer search: AMPC_PROPERTY_EXAMPLES=5000


def values(shape, scale=4.0):
    """float64 arrays of shape with finite values in [-scale, scale], none below 1e-3 but 0: no
    dtype rounds them to a subnormal (products of those round on a coarser grid than any relative
    tolerance; test_ops.py and the cast tests cover subnormals)."""
    element = st.floats(-scale, scale).map(lambda v: v if abs(v) >= 1e-3 else 0.0)
    return hnp.arrays(np.float64, shape, elements=element)


@st.composite
def arrays(draw, min_dims=1, max_dims=4, max_side=9, dtype=None, scale=4.0):
    """An array of a floating dtype with finite values, in a C-order, transposed, stepped or
    reversed layout (the same values whatever the layout)."""
    dtype = draw(st.sampled_from(FLOATS)) if dtype is None else dtype
    shape = draw(hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side))
    x = draw(values(shape, scale)).astype(dtype)
    layout = draw(st.sampled_from(["c", "transposed", "stepped", "reversed"]))
    if layout == "transposed" and x.ndim > 1:
        return np.ascontiguousarray(x.T).T
    if layout == "stepped":
        wide = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "reversed":
        return np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    return x


def unchanged(x, run):
    """run(x), checking that x is left bit for bit as it was."""
    before = np.ascontiguousarray(x).copy()
    out = run(x)
    np.testing.assert_array_equal(np.ascontiguousarray(x).view(np.uint8), before.view(np.uint8))
    return out


UNARY = {op.name: (op.forward(F), op.reference) for op in ref.pointwise("properties")}  # ops_reference.POINTWISE


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(), st.sampled_from(sorted(UNARY)))
def test_unary_ops(x, name):
    op, reference = UNARY[name]
    assert_close(unchanged(x, op), reference(f64(x)), x.dtype, what=name)


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(), st.data())
def test_binary_ops_broadcast(x, data):
    """add and mul against a second operand broadcast over some of x's dimensions."""
    shape = tuple(data.draw(st.sampled_from([1, n])) for n in x.shape)
    y = data.draw(values(shape)).astype(x.dtype)
    assert_close(F.add(x, y), f64(x) + f64(y), x.dtype, scale=np.abs(f64(x)) + np.abs(f64(y)), what="add")
    assert_close(F.mul(x, y), f64(x) * f64(y), x.dtype, what="mul")


# A model of torch's result_type for an elementwise op, written from its rules, not ampc's code:
# operands fall in three groups (arrays with dimensions, 0-d arrays, Python numbers), each promoted
# within itself; a lower group counts only where its category is higher than the groups above it.
_CATEGORY = {"b": 0, "i": 1, "u": 1}
_OPERAND_DTYPES = FLOATS + [np.dtype(t) for t in (np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64)]


def _category(dtype):
    return _CATEGORY.get(dtype.kind, 2) if dtype not in FLOATS else 2


def _torch_result_type(operands):
    groups = [[], [], []]
    for x in operands:
        if isinstance(x, (bool, int, float)):
            groups[2].append(np.dtype(np.bool_) if isinstance(x, bool) else
                             np.dtype(np.int64) if isinstance(x, int) else np.dtype(np.float32))
        else:
            groups[0 if x.ndim else 1].append(x.dtype)
    result = None  # (category, floating dtype or None)
    for group in reversed(groups):  # numbers, then 0-d arrays, then arrays with dimensions
        if not group:
            continue
        floats = [d for d in group if d in FLOATS]
        mine = (max(_category(d) for d in group),
                None if not floats else floats[0] if all(d == floats[0] for d in floats)
                else F64 if F64 in floats else np.dtype(np.float32))
        result = mine if result is None or result[0] <= mine[0] else result
    return result


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.data())
def test_elementwise_type_promotion(data):
    """add, mul and div of arrays of any dtype (integers and bools included), 0-d arrays and Python
    numbers: torch's result dtype, or the TypeError where torch's result would be an integer array
    (div gives float32); the values those of the operands read in the compute type, computed there
    and rounded once."""
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5))

    def operand(allow_number):
        kind = data.draw(st.sampled_from(["array", "0-d"] + (["number"] if allow_number else [])))
        if kind == "number":
            number = st.floats(-50, 50).map(lambda v: round(v, 3))
            return data.draw(st.one_of(st.booleans(), st.integers(-50, 50), number))
        dtype = data.draw(st.sampled_from(_OPERAND_DTYPES))
        v = data.draw(values(shape if kind == "array" else (), scale=50.0))
        return (v > 0 if dtype.kind == "b" else np.abs(v) if dtype.kind == "u" else v).astype(dtype)

    a, b = operand(False), operand(True)
    name = data.draw(st.sampled_from(["add", "mul", "div"]))
    category, dtype = _torch_result_type([a, b])
    if category < 2 and name != "div":
        with pytest.raises(TypeError, match=f"{name}: (input|other) must be a floating array"):
            getattr(F, name)(a, b)
        return
    dtype = dtype if category == 2 else np.dtype(np.float32)
    out = getattr(F, name)(a, b)
    assert np.asarray(out).dtype == dtype
    acc = F64 if dtype == F64 else np.dtype(np.float32)
    ins = [float(v) if isinstance(v, (bool, int, float)) else np.asarray(v).astype(acc) for v in (a, b)]
    with np.errstate(all="ignore"):
        want = {"add": np.add, "mul": np.multiply, "div": np.divide}[name](*ins)
        want = np.asarray(want, dtype=acc).astype(dtype)
    got = np.asarray(out)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(), st.data(), st.booleans())
def test_softmax_over_any_dimension(x, data, log):
    dim = data.draw(st.integers(-x.ndim, x.ndim - 1))
    op, reference = (F.log_softmax, ref.log_softmax) if log else (F.softmax, ref.softmax)
    expected = reference(f64(x), dim)
    assert_close(unchanged(x, lambda a: op(a, dim)), expected, x.dtype,
                 scale=np.abs(expected).max() if log else None, what="log_softmax" if log else "softmax")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(), st.data())
def test_sum_and_mean_over_any_dimensions(x, data):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, x.ndim - 1), min_size=1))))
    keepdim = data.draw(st.booleans())
    total = f64(x).sum(axis=axes, keepdims=keepdim)
    scale = np.abs(f64(x)).sum(axis=axes, keepdims=keepdim)
    rtol = 2 * ref.RTOL[x.dtype]
    assert_close(F.sum(x, axes, keepdim), total, x.dtype, scale=scale, rtol=rtol, what="sum")
    count = x.size // max(total.size, 1)
    assert_close(F.mean(x, axes, keepdim), total / count, x.dtype, scale=scale / count, rtol=rtol, what="mean")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(max_side=12), st.data())
def test_layer_norm_over_trailing_dimensions(x, data):
    k = data.draw(st.integers(1, x.ndim))
    nshape = x.shape[x.ndim - k:]
    w = data.draw(values(nshape)).astype(x.dtype)
    expected = ref.layer_norm(f64(x), k, f64(w), None)
    assert_close(unchanged(x, lambda a: F.layer_norm(a, nshape, w)), expected, x.dtype,
                 rtol=2 * ref.RTOL[x.dtype], scale=np.abs(f64(w)).max(), what="layer_norm")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(min_dims=2, max_dims=3, max_side=12), st.integers(1, 9), st.booleans())
def test_linear(x, out_features, bias):
    rng = np.random.default_rng(x.size)
    w = rng.standard_normal((out_features, x.shape[-1])).astype(x.dtype)
    b = rng.standard_normal(out_features).astype(x.dtype) if bias else None
    expected = f64(x) @ f64(w).T + (f64(b) if bias else 0.0)
    scale = np.abs(f64(x)) @ np.abs(f64(w)).T + (np.abs(f64(b)) if bias else 0.0)
    assert_close(unchanged(x, lambda a: F.linear(a, w, b)), expected, x.dtype, scale=scale,
                 rtol=2 * ref.RTOL[x.dtype], what="linear")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(min_dims=2, max_dims=2, max_side=12), st.data(), st.floats(0.0, 0.5))
def test_cross_entropy(logits, data, smoothing):
    n, c = logits.shape
    target = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), np.int64)
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    expected = ref.cross_entropy(f64(logits), target, reduction=reduction, label_smoothing=smoothing)
    got = unchanged(logits, lambda a: F.cross_entropy(a, target, reduction=reduction, label_smoothing=smoothing))
    assert np.asarray(got).dtype == logits.dtype
    assert_close(got, expected, logits.dtype, scale=np.abs(expected).max() + np.abs(f64(logits)).max(),
                 rtol=2 * ref.RTOL[logits.dtype], what="cross_entropy")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(min_dims=4, max_dims=4, max_side=7), st.data())
def test_pools(x, data):
    h, w = x.shape[2:]
    k = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    pad = (data.draw(st.integers(0, k[0] // 2)), data.draw(st.integers(0, k[1] // 2)))
    ceil = data.draw(st.booleans())
    y, idx = unchanged(x, lambda a: F.max_pool2d(a, k, stride, pad, 1, ceil, return_indices=True))
    want, _ = sref.max_pool2d(f64(x), k, stride, pad, (1, 1), ceil)
    np.testing.assert_array_equal(f64(y), want)  # a maximum is one of the inputs: exact
    include = data.draw(st.booleans())
    assert_close(F.avg_pool2d(x, k, stride, pad, ceil, include), sref.avg_pool2d(f64(x), k, stride, pad, ceil, include),
                 x.dtype, rtol=2 * ref.RTOL[x.dtype], what="avg_pool2d")
    size = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    assert_close(F.adaptive_avg_pool2d(x, size), sref.adaptive_avg_pool2d(f64(x), size), x.dtype,
                 rtol=2 * ref.RTOL[x.dtype], what="adaptive_avg_pool2d")


@settings(max_examples=EXAMPLES, deadline=None)
@given(arrays(min_dims=4, max_dims=4, max_side=6).filter(lambda a: a.shape[0] * a.shape[2] * a.shape[3] > 1))
def test_batch_norm_training(x):
    c = x.shape[1]
    acc = F64 if x.dtype == F64 else np.dtype(np.float32)
    w, b = np.linspace(0.5, 1.5, c).astype(acc), np.linspace(-1, 1, c).astype(acc)
    mean, var, _ = sref.batch_stats(f64(x))
    expected = sref.batch_norm(f64(x), mean, var, f64(w), f64(b))
    got = unchanged(x, lambda a: F.batch_norm(a, None, None, w, b, training=True))
    # the normalised values reach |x - mean| / std, which a tiny variance makes large
    assert_close(got, expected, x.dtype, rtol=4 * ref.RTOL[x.dtype], scale=np.abs(expected).max(), what="batch_norm")


def group_norm_reference(x, groups, w=None, b=None, eps=1e-5):
    """group_norm in float64: x (N, C, *) normalised over each group's channels and positions, then
    per channel w and b."""
    rows = x.reshape(x.shape[0], groups, -1)
    y = ((rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + eps)).reshape(x.shape)
    channel = (-1,) + (1,) * (x.ndim - 2)
    return y * (1 if w is None else w.reshape(channel)) + (0 if b is None else b.reshape(channel))


@st.composite
def group_norm_case(draw, dtype=None, max_side=6):
    """(x (N, C, *) with C a multiple of the groups, in a C-order, channels-last, stepped or reversed
    layout; groups; weight or None; bias or None)."""
    dtype = draw(st.sampled_from(FLOATS)) if dtype is None else dtype
    groups, per_group = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    positions = draw(st.lists(st.integers(1, max_side), max_size=2))
    c = groups * per_group
    x = draw(values((draw(st.integers(1, 3)), c, *positions))).astype(dtype)
    layout = draw(st.sampled_from(["c", "channels_last", "stepped", "reversed"]))
    if layout == "channels_last" and x.ndim > 2:
        order = (0, *range(2, x.ndim), 1)
        x = np.ascontiguousarray(x.transpose(order)).transpose(np.argsort(order))
    elif layout == "stepped":
        wide = np.full(x.shape[:-1] + (2 * x.shape[-1],), np.nan, dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
    elif layout == "reversed":
        x = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    affine = draw(st.sampled_from(["both", "weight", "bias", "none"]))
    w = draw(values((c,))).astype(dtype) if affine in ("both", "weight") else None
    b = draw(values((c,))).astype(dtype) if affine in ("both", "bias") else None
    return x, groups, w, b


@settings(max_examples=EXAMPLES, deadline=None)
@given(group_norm_case())
def test_group_norm(case):
    x, groups, w, b = case
    expected = group_norm_reference(f64(x), groups, None if w is None else f64(w), None if b is None else f64(b))
    got = unchanged(x, lambda a: F.group_norm(a, groups, w, b))
    scale = 1.0 if w is None else np.abs(f64(w)).max()
    assert_close(got, expected, x.dtype, rtol=4 * ref.RTOL[x.dtype], scale=scale, what="group_norm")


# -- backward passes: float64 against central differences of the forward ----------------------------

BACKWARD_EXAMPLES = max(EXAMPLES // 3, 10)  # a finite difference per element: slower per example


def finite_difference_check(forward, x, grad_output, got, what):
    """got against d(sum(forward(x) * grad_output)) / dx by central differences, every element.
    Their rounding, about 1e-16 * sum(|forward(x) * grad_output|) / h (h = 1e-6), sets the floor of
    the tolerance (rtol 1e-6 times 1e-2 of that sum: 100 times it)."""
    want = ref.numeric_grad(forward, np.ascontiguousarray(x).copy(), grad_output)  # numeric_grad writes x
    terms = float(np.abs(np.asarray(forward(x), np.float64) * grad_output).sum())
    assert_close(got, want, F64, rtol=1e-6, scale=np.abs(want).max() + 1e-2 * max(terms, 1.0), what=what)


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(arrays(max_dims=3, max_side=6, dtype=F64), st.data(), st.booleans())
def test_softmax_backward(x, data, log):
    dim = data.draw(st.integers(-x.ndim, x.ndim - 1))
    g = data.draw(values(x.shape))
    op, backward = (F.log_softmax, F.log_softmax_backward) if log else (F.softmax, F.softmax_backward)
    got = unchanged(x, lambda a: backward(g, op(a, dim), dim))
    finite_difference_check(lambda a: op(a, dim), x, g, got, "log_softmax" if log else "softmax")


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(arrays(max_dims=3, max_side=6, dtype=F64), st.data())
def test_layer_norm_backward(x, data):
    k = data.draw(st.integers(1, x.ndim))
    nshape = x.shape[x.ndim - k:]
    # rows that spread, as group_norm's (groups_spread): [1., 1.]'s differences err by 5e-8
    rows = x.reshape(-1, math.prod(nshape))
    assume(rows.shape[1] == 1 or (rows.var(-1) > 1e-2).all())
    w, b, g = data.draw(values(nshape)), data.draw(values(nshape)), data.draw(values(x.shape))
    gi, gw, gb = unchanged(x, lambda a: F.layer_norm_backward(g, a, nshape, w, b))
    finite_difference_check(lambda a: F.layer_norm(a, nshape, w, b), x, g, gi, "layer_norm input")
    finite_difference_check(lambda v: F.layer_norm(x, nshape, v, b), w, g, gw, "layer_norm weight")
    finite_difference_check(lambda v: F.layer_norm(x, nshape, w, v), b, g, gb, "layer_norm bias")


def groups_spread(case):
    """Whether every group's values spread: where a group's variance is small against eps,
    normalising it is so curved that central differences err more than the tolerance (two equal
    values: an exact gradient of 0, differences of -5e-8)."""
    x, groups = case[0], case[1]
    return bool((f64(x).reshape(x.shape[0], groups, -1).var(-1) > 1e-2).all())


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(group_norm_case(dtype=F64, max_side=4).filter(groups_spread), st.data())
def test_group_norm_backward(case, data):
    x, groups, w, b = case
    g = data.draw(values(x.shape))
    gi, gw, gb = unchanged(x, lambda a: F.group_norm_backward(g, a, groups, w, b))
    finite_difference_check(lambda a: F.group_norm(a, groups, w, b), x, g, gi, "group_norm input")
    if w is not None:
        finite_difference_check(lambda v: F.group_norm(x, groups, v, b), w, g, gw, "group_norm weight")
    if b is not None:
        finite_difference_check(lambda v: F.group_norm(x, groups, w, v), b, g, gb, "group_norm bias")
    assert (gw is None) == (w is None) and (gb is None) == (b is None)


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(arrays(min_dims=2, max_dims=2, max_side=6, dtype=F64), st.data(), st.floats(0.0, 0.5))
def test_cross_entropy_backward(logits, data, smoothing):
    n, c = logits.shape
    target = np.array(data.draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n)), np.int64)
    reduction = data.draw(st.sampled_from(["mean", "sum", "none"]))
    g = np.asarray(data.draw(values((n,) if reduction == "none" else ())))
    got = unchanged(logits, lambda a: F.cross_entropy_backward(g, a, target, reduction=reduction,
                                                               label_smoothing=smoothing))
    finite_difference_check(lambda a: F.cross_entropy(a, target, reduction=reduction, label_smoothing=smoothing),
                            logits, g, got, "cross_entropy")


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(arrays(min_dims=4, max_dims=4, max_side=4, dtype=F64).filter(lambda a: a.shape[0] * a.shape[2] * a.shape[3] > 1),
       st.data())
def test_batch_norm_backward(x, data):
    c = x.shape[1]
    w, b, g = data.draw(values((c,))), data.draw(values((c,))), data.draw(values(x.shape))
    gi, gw, gb = unchanged(x, lambda a: F.batch_norm_backward(g, a, w, training=True))
    forward = lambda a, ww=w, bb=b: F.batch_norm(a, None, None, ww, bb, training=True)  # noqa: E731
    finite_difference_check(forward, x, g, gi, "batch_norm input")
    finite_difference_check(lambda v: forward(x, v, b), w, g, gw, "batch_norm weight")
    finite_difference_check(lambda v: forward(x, w, v), b, g, gb, "batch_norm bias")


@settings(max_examples=BACKWARD_EXAMPLES, deadline=None)
@given(arrays(min_dims=4, max_dims=4, max_side=6, dtype=F64), st.data())
def test_pool_backward(x, data):
    h, w = x.shape[2:]
    k = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    stride = (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    pad = (data.draw(st.integers(0, k[0] // 2)), data.draw(st.integers(0, k[1] // 2)))
    ceil, include = data.draw(st.booleans()), data.draw(st.booleans())
    avg = lambda a: F.avg_pool2d(a, k, stride, pad, ceil, include)  # noqa: E731
    g = data.draw(values(avg(x).shape))
    got = unchanged(x, lambda a: F.avg_pool2d_backward(g, a, k, stride, pad, ceil, include))
    finite_difference_check(avg, x, g, got, "avg_pool2d")
    size = (data.draw(st.integers(1, h)), data.draw(st.integers(1, w)))
    g = data.draw(values(x.shape[:2] + size))
    finite_difference_check(lambda a: F.adaptive_avg_pool2d(a, size), x, g, F.adaptive_avg_pool2d_backward(g, x),
                            "adaptive_avg_pool2d")
