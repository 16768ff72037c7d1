"""ampc.nn.functional on the CPU: every op, forward and backward, against a float64 reference on
fresh random data (odd sizes, size 1, non-contiguous inputs) in float32, float16, bfloat16 and
float64; backward passes also against float64 finite differences; dtypes under autocast; bad
input."""

import ctypes
import ctypes.util
import math

import numpy as np
import pytest

import ampc
from ampc.nn import _bare_ops
import ops_reference as ref
from ops_reference import BF16, F16, F32, F64, FLOATS, assert_close, f64, numeric_grad

F = ampc.nn.functional

SHAPES = [(1,), (7,), (3, 5), (2, 3, 17), (1, 1)]


@pytest.fixture
def rng(test_seed):
    # each test its own data, drawn again under the same AMPC_TEST_SEED (conftest.py)
    return np.random.default_rng(test_seed)


def bits(a):
    """The bytes of an array (or 0-d result), for bit-exact comparisons."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def noncontiguous(x):
    """The same values in a strided layout: every other element of a wider array."""
    wide = np.empty(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
    wide[..., ::2] = x
    wide[..., 1::2] = np.nan  # poison: a kernel reading the gaps gives NaN
    view = wide[..., ::2]
    assert not view.flags.c_contiguous or x.shape[-1] <= 1
    return view


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------

# the pointwise ops of ops_reference.POINTWISE that these lists name
UNARY = [(op.name, op.forward(F), op.reference) for op in ref.pointwise("cpu")]


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("name,op,reference", UNARY, ids=[u[0] for u in UNARY])
def test_unary_forward(rng, name, op, reference, shape, dtype):
    x = ref.random(rng, shape, dtype)
    before = x.copy()
    assert_close(op(x), reference(f64(x)), dtype, what=name)
    assert_close(op(noncontiguous(x)), reference(f64(x)), dtype, what=name + " strided")
    np.testing.assert_array_equal(x.view(np.uint8), before.view(np.uint8))


def _ulps(got, want):
    """|got - want| in units of the last place of want rounded to float32 (the subnormal step below)."""
    rounded = np.abs(want.astype(np.float32)).astype(np.float64)
    step = np.maximum(np.spacing(rounded.astype(np.float32)).astype(np.float64), 2.0**-149)
    return np.abs(got.astype(np.float64) - want) / step


def test_float32_exp_within_an_ulp_everywhere():
    """ampc's vectorisable expf (cpu/vector_math.h) over a sweep of float32 bit patterns through its
    whole range, subnormal results included: within 1 ulp of e^x (its full sweep measured 0.98),
    and exact at the edges: inf, -inf, NaN, overflow and underflow."""
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[(x > -104) & (x < 88.72)]
    got = F.exp(x)
    assert _ulps(got, np.exp(x.astype(np.float64))).max() <= 1.0
    edges = np.array([np.inf, -np.inf, np.nan, 88.7229, 89.5, -103.98, -104.5, 0.0, -0.0], np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(F.exp(edges), np.exp(edges.astype(np.float64)).astype(np.float32))


def test_float32_log_within_an_ulp_everywhere():
    """ampc's vectorisable logf (cpu/vector_math.h) over a sweep of float32 bit patterns, subnormals
    included: within 1 ulp of log x (a sweep of a 97th of all floats measured 0.87), and log(0) =
    -inf, log(inf) = inf, NaN for negative x and NaN."""
    bits = np.arange(0, 2**31, 4099, dtype=np.uint64).astype(np.uint32)  # the positive floats
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (x > 0)]
    assert _ulps(F.log(x), np.log(x.astype(np.float64))).max() <= 1.0
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 1.0, 2.0**-149], np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(F.log(edges), np.log(edges.astype(np.float64)).astype(np.float32))


def test_bce_with_logits_through_a_vectorised_log1p():
    """binary_cross_entropy_with_logits's log1p(e^-|x|) (ampc's log1pf: log(w) u / (w - 1)) within a few
    ulp of float64's, over logits from -90 to 90 and the targets 0, 1 and between (torch's form,
    (1 - t) x - log_sigmoid(x), cancels by up to an ulp of x where the loss is far below x)."""
    x = np.linspace(-90, 90, 20001, dtype=np.float32)
    for t in (0.0, 1.0, 0.3):
        y = np.full_like(x, t)
        got = F.binary_cross_entropy_with_logits(x, y, reduction="none")
        x64 = x.astype(np.float64)
        want = (1 - t) * x64 - (np.minimum(x64, 0) - np.log1p(np.exp(-np.abs(x64))))
        assert np.all(np.abs(got - want) <= 4e-7 * np.abs(want) + 6e-8 * np.abs(x64)), t


def test_float32_tanh_within_two_ulp_everywhere():
    """ampc's vectorisable tanhf (a sweep of all float32 measured 1.33 ulp), its signed zeros, NaN and
    infinities exact."""
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    assert _ulps(F.tanh(x), np.tanh(x.astype(np.float64))).max() <= 1.5
    edges = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 9.0, -9.0], np.float32)
    got, want = F.tanh(edges), np.tanh(edges)
    np.testing.assert_array_equal(got, want)
    assert np.array_equal(np.signbit(got), np.signbit(want))


def test_float32_gelu_keeps_its_relative_precision_in_the_tail():
    """gelu through ampc's vectorisable erfc (cpu/vector_math.h): within 16 ulp of the float64 gelu
    for |x| <= 3 and within 70 ulp out to x = -8, where gelu is 1e-14 and the rounding of x / sqrt(2)
    alone costs 60 ulp (libm's erfcf does no better); 1 + erf(x / sqrt(2)) would have lost every bit."""
    bits = np.arange(0, 2**32, 9973, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & (np.abs(x) > 1e-30)]
    x64 = x.astype(np.float64)
    want = 0.5 * x64 * np.vectorize(math.erfc)(-x64 / math.sqrt(2))  # erfc: 1 + erf cancels in float64 too
    near = np.abs(x) <= 3
    assert _ulps(F.gelu(x[near]), want[near]).max() <= 16
    tail = (x >= -8) & (x < -3)
    assert _ulps(F.gelu(x[tail]), want[tail]).max() <= 70


def test_every_instruction_set_gives_the_same_bits(rng):
    """The float kernels are compiled for SSE2 and for AVX2: the same operations in the same order,
    so the same bits on either (vectorisation never reorders a sum: the lanes are written out)."""
    x = ref.random(rng, (37, 1000), F32) * 4
    t = rng.integers(0, 1000, 37)
    ops = [F.exp, F.sigmoid, F.silu, F.gelu, lambda v: F.gelu(v, approximate="tanh"), F.tanh,
           lambda v: F.log(np.abs(v)),
           lambda v: F.binary_cross_entropy_with_logits(v, np.abs(v) / (1 + np.abs(v)), reduction="none"),
           lambda v: F.softmax(v, -1), lambda v: F.log_softmax(v, 0), lambda v: F.layer_norm(v, (1000,)),
           lambda v: F.cross_entropy(v, t), lambda v: F.cross_entropy_backward(np.float32(1), v, t),
           lambda v: F.sum(v, 1), lambda v: F.softmax_backward(v, F.softmax(v, -1), -1),
           lambda v: F.silu_backward(v, v), lambda v: F.gelu_backward(v, v),
           lambda v: F.layer_norm_backward(v, v, (1000,))[0],
           lambda v: F.group_norm(v.reshape(37, 8, 125), 4), lambda v: F.mean(v, 1)]
    results = {}
    previous = ampc._C._cpu_isa()
    try:
        for isa in ampc._C._cpu_isas():
            ampc._C._set_cpu_isa(isa)
            results[isa] = [np.asarray(op(x)).view(np.uint32) for op in ops]
    finally:
        ampc._C._set_cpu_isa(previous)
    first = next(iter(results.values()))
    for isa, got in results.items():
        for i, (a, b) in enumerate(zip(first, got)):
            np.testing.assert_array_equal(a, b, err_msg=f"op {i} on {isa}")


def test_log_of_positive(rng):
    for dtype in FLOATS:
        x = np.abs(ref.random(rng, (4, 9), dtype)) + dtype.type(0.5)
        assert_close(F.log(x), np.log(f64(x)), dtype, what="log")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("beta,threshold", [(1.0, 20.0), (2.0, 1.5), (0.5, -1.0)], ids=str)
def test_softplus_and_mish_every_element(rng, dtype, beta, threshold):
    """softplus (torch's: x itself, bit for bit, where beta x > threshold) and mish over a wide range
    and their special values, forward and backward, every element against the float64 formulas; each
    output a fresh array (no poisoned buffer shows through) and the input left as it was."""
    x = np.concatenate([ref.random(rng, (300,), dtype, scale=8.0),
                        np.array([0.0, -0.0, 1.0, -1.0, 19.5, 20.5, 30.0, -30.0, -200.0, 90.0, 1e4, -1e4,
                                  np.inf, -np.inf]).astype(dtype)])
    g = ref.random(rng, x.shape, dtype)
    before = x.copy()
    xd, gd = f64(x), f64(g)
    finite = np.isfinite(xd)
    with np.errstate(over="ignore", invalid="ignore"):
        y = F.softplus(x, beta, threshold)
        assert_close(y[finite], ref.softplus(xd, beta, threshold)[finite], dtype, scale=0, what="softplus")
        assert y[-2] == np.inf and y[-1] == 0  # x at inf; log1p(e^-inf) / beta at -inf
        above = xd * beta > threshold
        np.testing.assert_array_equal(y[above].view(np.uint8), x[above].view(np.uint8))
        dx = F.softplus_backward(g, x, beta, threshold)
        assert_close(dx, ref.softplus_grad(gd, xd, beta, threshold), dtype, what="softplus_backward")
        np.testing.assert_array_equal(dx[above].view(np.uint8), g[above].view(np.uint8))
        m = F.mish(x)
        assert_close(m[finite], ref.mish(xd[finite]), dtype, scale=0, what="mish")
        assert m[-2] == np.inf and np.isnan(m[-1])  # torch's: inf * tanh(inf), -inf * tanh(0)
        # the gradient crosses 0 (near x = -1.19): its tolerance is relative to its largest value
        assert_close(F.mish_backward(g, x)[finite], ref.mish_grad(gd, xd)[finite], dtype, what="mish_backward")
    np.testing.assert_array_equal(x.view(np.uint8), before.view(np.uint8))


def test_softplus_and_mish_on_the_tape_and_in_place(rng):
    """softplus and mish as ampc.autograd records them (the gradient of a loss through them equals
    the backward functions'), and mish(inplace=True) writing the caller's array, as torch's."""
    x = ref.random(rng, (4, 6), F32, scale=3.0)
    g = ref.random(rng, (4, 6), F32)
    for fwd, bwd in ((lambda t: F.softplus(t, 2.0, 1.0), lambda: F.softplus_backward(g, x, 2.0, 1.0)),
                     (F.mish, lambda: F.mish_backward(g, x))):
        p = ampc.nn.Parameter(x.copy())
        fwd(p).backward(g)
        np.testing.assert_array_equal(p.grad, bwd())
    a = x.copy()
    assert F.mish(a, inplace=True) is a
    np.testing.assert_array_equal(a, F.mish(x))
    for bad in ({"beta": "2"}, {"threshold": None}):  # a clear error naming the op, not float()'s
        with pytest.raises(TypeError, match=f"softplus: {next(iter(bad))} must be a number"):
            F.softplus(x, **bad)
        with pytest.raises(TypeError, match=f"softplus_backward: {next(iter(bad))} must be a number"):
            F.softplus_backward(g, x, **bad)


def test_relu_keeps_nan():
    x = np.array([np.nan, -1.0, 2.0], np.float32)
    out = F.relu(x)
    assert np.isnan(out[0]) and out[1] == 0 and out[2] == 2


BACKWARD_UNARY = [(op.name, op.forward(F), op.backward(F)) for op in ref.pointwise("cpu_grad")]


@pytest.mark.parametrize("name,fwd,bwd", BACKWARD_UNARY, ids=[u[0] for u in BACKWARD_UNARY])
def test_unary_backward_finite_differences(rng, name, fwd, bwd):
    x = rng.standard_normal((3, 7))
    if name == "relu":
        x[np.abs(x) < 1e-3] = 0.5  # away from the kink
    r = rng.standard_normal(x.shape)
    assert_close(bwd(r, x), numeric_grad(fwd, x.copy(), r), F64, rtol=1e-6, what=name)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
@pytest.mark.parametrize("name,fwd,bwd", BACKWARD_UNARY, ids=[u[0] for u in BACKWARD_UNARY])
def test_unary_backward_low_precision(rng, name, fwd, bwd, dtype):
    """The gradient in the input's dtype, within its rounding of the float64 gradient."""
    x = ref.random(rng, (5, 33), dtype)
    g = ref.random(rng, (5, 33), dtype)
    exact = bwd(f64(g), f64(x))
    assert_close(bwd(g, x), exact, dtype, what=name)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_abs_sqrt_rsqrt_and_their_gradients_round_once(rng, dtype):
    """abs, sqrt and rsqrt against float64 (NaN at negative inputs for the roots, as torch's), each
    value within its dtype's rounding; the gradients from the values the forward returned (as the
    tape keeps them), within one rounding of the float64 formula on those same values."""
    x = ref.random(rng, (5, 37), dtype)
    x[0, :4] = np.array([0.25, 4.0, 2.0, -1.0]).astype(dtype)  # roots exact and not, a negative
    g = ref.random(rng, (5, 37), dtype)
    xd, gd = f64(x), f64(g)
    with np.errstate(invalid="ignore"):
        for name, op, want in (("abs", F.abs, np.abs(xd)), ("sqrt", F.sqrt, np.sqrt(xd)),
                               ("rsqrt", F.rsqrt, 1 / np.sqrt(xd))):
            assert_close(op(x), want, dtype, scale=0, what=name)
        root, inverse = F.sqrt(x), F.rsqrt(x)
        assert_close(F.abs_backward(g, x), gd * np.sign(xd), dtype, scale=0, what="abs_backward")
        assert_close(F.sqrt_backward(g, root), 0.5 * gd / f64(root), dtype, scale=0, what="sqrt_backward")
        # -x^(-3/2) / 2 at a float16 subnormal x can pass float16's range: such a value rounds to inf
        want = -0.5 * gd * f64(inverse) ** 3
        with np.errstate(over="ignore"):
            rounded = want.astype(dtype)
        beyond = np.isinf(rounded) & np.isfinite(want)
        got = np.asarray(F.rsqrt_backward(g, inverse))
        np.testing.assert_array_equal(got[beyond], rounded[beyond])
        assert_close(np.where(beyond, 0, got).astype(dtype), np.where(beyond, 0, want), dtype, scale=0,
                     what="rsqrt_backward")
    assert F.abs_backward(np.ones(2), np.array([0.0, -0.0])).tolist() == [0.0, 0.0]  # torch's 0 at 0


def test_gradients_at_nan_as_torch():
    """relu's gradient passes at a NaN input (torch's threshold_backward zeroes only x <= 0: a NaN
    loss keeps NaN gradients, and the scaler skips the step); abs's and l1_loss's are 0 there
    (torch's sign of NaN is 0). Values from torch 2.15's autograd."""
    x = np.array([np.nan, -1.0, 0.0, 2.0], np.float32)
    g = np.array([0.5, 1.0, 1.0, 1.0], np.float32)
    np.testing.assert_array_equal(F.relu_backward(g, x), [0.5, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(F.relu_backward(g, F.relu(x)), [0.5, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(F.abs_backward(g, x), [0.0, -1.0, 0.0, 1.0])
    np.testing.assert_array_equal(F.l1_loss_backward(1.0, x, np.zeros(4, np.float32), reduction="sum"),
                                  [0.0, -1.0, 0.0, 1.0])


def libm_pow(v, q):
    """C's powf or pow element by element, as ampc's CPU kernel and torch's scalar path call it (NumPy
    2.4's vectorised power is an ulp away from them at times)."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    c_type = ctypes.c_float if v.dtype == F32 else ctypes.c_double
    fn = libm.powf if v.dtype == F32 else libm.pow
    fn.restype, fn.argtypes = c_type, [c_type, c_type]
    return np.array([fn(float(a), q) for a in v], v.dtype)


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, -2.0, 0.5, -0.5, -1.0, 1.5])
def test_pow_by_a_number_is_torch_s_special_case(p, dtype):
    """torch computes x ** p for these p by other operations (a fill, a copy, x * x, x * x * x,
    1 / (x * x), sqrt, 1 / sqrt, 1 / x) and their values differ from pow's at special inputs
    (sqrt(-inf) is NaN where pow(-inf, 0.5) is inf) and by an ulp elsewhere (x * x * x is two
    roundings); the gradient is torch's grad * (p * x ** (p - 1)) through the same cases. Bit for bit,
    on infinities, signed zeros, NaN, negatives and random values."""
    x = np.concatenate([[-np.inf, np.inf, -0.0, 0.0, np.nan, -8.0, 1e-30, 3.0],
                        np.random.default_rng(5).standard_normal(40) * 3]).astype(dtype)
    g = np.linspace(0.5, 2.0, x.size).astype(dtype)

    def torch_pow(v, q):
        with np.errstate(all="ignore"):
            cases = {0.0: np.ones_like(v), 1.0: v, 2.0: v * v, 3.0: v * v * v, -2.0: 1 / (v * v),
                     0.5: np.sqrt(v), -0.5: 1 / np.sqrt(v), -1.0: 1 / v}
            return cases[q] if q in cases else libm_pow(v, q)

    def bits(a):
        return np.asarray(a, dtype).view(np.uint32 if dtype == F32 else np.uint64)

    np.testing.assert_array_equal(bits(F.pow(x, p)), bits(torch_pow(x, p)))
    with np.errstate(all="ignore"):
        want = np.zeros_like(x) if p == 0 else g * (dtype.type(p) * torch_pow(x, p - 1))
    np.testing.assert_array_equal(bits(F.pow_backward(g, x, p)), bits(want))


def test_bce_with_logits_at_infinite_logits():
    """The loss's limit where torch's (1 - t) x - log_sigmoid(x) is inf - inf: inf for a confident
    wrong logit, 0 where the target agrees (t = 1 at +inf, t = 0 at -inf); torch answers NaN at
    -inf. The gradient sigmoid(x) - t is finite there."""
    x = np.array([np.inf, -np.inf, np.inf, -np.inf, np.inf, np.nan], np.float32)
    t = np.array([0.3, 0.3, 1.0, 0.0, 0.0, 0.5], np.float32)
    loss = F.binary_cross_entropy_with_logits(x, t, reduction="none")
    np.testing.assert_array_equal(loss, [np.inf, np.inf, 0.0, 0.0, np.inf, np.nan])
    grad = F.binary_cross_entropy_with_logits_backward(1.0, x, t, reduction="none")
    np.testing.assert_allclose(grad, [0.7, -0.3, 0.0, 0.0, 1.0, np.nan], rtol=1e-7)


def test_pow_array_exponent_gradients(rng):
    """Both gradients of input ** exponent with broadcast arrays (shaped as the output: summed here
    over the broadcast dimensions, as the tape does), against finite differences in float64
    (positive bases: the log in the exponent's gradient)."""
    x = rng.random((3, 1, 5)) + 0.5
    e = rng.standard_normal((4, 1)) * 2
    r = rng.standard_normal((3, 4, 5))
    gx = F.pow_backward(r, x, e)
    ge = F.pow_exponent_backward(r, x, e)
    assert gx.shape == ge.shape == r.shape
    assert_close(gx.sum(1, keepdims=True), numeric_grad(lambda v: F.pow(v, e), x.copy(), r), F64, rtol=1e-6)
    assert_close(ge.sum((0, 2))[:, None], numeric_grad(lambda v: F.pow(x, v), e.copy(), r), F64, rtol=1e-6)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
def test_pow_array_exponent_gradients_low_precision(rng, dtype):
    """In the gradient's dtype (input's, exponent's), within its rounding of the float64 gradient; the
    exponent's gradient in float32 when the exponent is float32 and the input is narrower."""
    x = (rng.random((5, 33)) + 0.25).astype(dtype)
    e = ref.random(rng, (5, 33), dtype)
    g = ref.random(rng, (5, 33), dtype)
    ex, ee, eg = f64(x), f64(e), f64(g)
    assert_close(F.pow_backward(g, x, e), eg * ee * ex ** (ee - 1), dtype)
    assert_close(F.pow_exponent_backward(g, x, e), eg * ex ** ee * np.log(ex), dtype)
    e32 = f64(e).astype(F32)
    out = F.pow_exponent_backward(g, x, e32)
    assert out.dtype == F32
    assert_close(out, eg * ex ** ee * np.log(ex), F32)


def test_pow_gradients_at_zero_as_torch():
    """torch's special cases: the input's gradient is 0 where the exponent is 0 (0 ** -1 * 0 would be
    NaN), for a number exponent even against a NaN grad_output; the exponent's gradient is 0 where
    the input is 0 and the exponent >= 0 (log 0 = -inf), -inf where 0 is raised to a negative power;
    NaN for a negative input to a fractional power. Values from torch 2.15's autograd."""
    x = np.array([0.0, 0.0, 2.0, -1.0, 0.0, 0.0, -2.0])
    e = np.array([0.0, -1.0, 1.5, 2.0, 2.0, 0.5, 0.5])
    g = np.ones(7)
    np.testing.assert_array_equal(F.pow_backward(g, x, e), [0.0, -np.inf, 1.5 * 2 ** 0.5, -2.0, 0.0, np.inf, np.nan])
    np.testing.assert_array_equal(F.pow_exponent_backward(g, x, e),
                                  [0.0, -np.inf, 2 ** 1.5 * np.log(2.0), np.nan, 0.0, 0.0, np.nan])
    np.testing.assert_array_equal(F.pow_backward(np.array([1.0, np.nan, 1.0]), np.array([0.0, 0.0, 3.0]), 0.0), 0.0)
    np.testing.assert_array_equal(F.pow_backward(np.ones(2), np.array([0.0, 3.0]), -1.0), [-np.inf, -1 / 9])
    # a number grad_output, as with any other exponent
    np.testing.assert_array_equal(F.pow_backward(2.0, np.array([0.0, 3.0]), 0.0), [0.0, 0.0])
    np.testing.assert_array_equal(F.pow_backward(2.0, np.array([0.0, 3.0]), 2.0), [0.0, 12.0])


def test_binary_broadcast_and_promotion(rng):
    a = ref.random(rng, (4, 1, 5), F16)
    b = ref.random(rng, (3, 1), BF16)
    out = F.add(a, b)
    assert out.dtype == F32 and out.shape == (4, 3, 5)  # float16 with bfloat16: float32, as torch
    assert_close(out, f64(a) + f64(b), F32)
    c = ref.random(rng, (5,), F32)
    assert F.mul(a, c).dtype == F32
    assert F.mul(a, a).dtype == F16
    assert_close(F.mul(a, c), f64(a) * f64(c), F32)
    assert_close(F.div(c, c + np.float32(3)), f64(c) / (f64(c) + 3), F32)
    assert_close(F.sub(a, a, alpha=2), -f64(a), F16)
    # a Python number takes no part in promotion
    assert F.add(a, 2.5).dtype == F16
    assert_close(F.add(a, 2.5), f64(a) + 2.5, F16)
    assert_close(F.mul(noncontiguous(c), 3.0), f64(c) * 3, F32)


I64, I32, I16, U8, BOOL = (np.dtype(t) for t in (np.int64, np.int32, np.int16, np.uint8, np.bool_))

# torch's result dtypes (ATen's result_type): arrays with dimensions promote among themselves; 0-d
# arrays and then Python numbers count only where their category (bool < integer < floating) is
# higher, a Python float as float32; integers beside a floating operand take its dtype.
PROMOTIONS = [
    ("add", (3, 4), F16, (3, 4), I64, F16),
    ("add", (3, 4), F32, (4,), I32, F32),
    ("mul", (3, 4), BF16, (3, 4), BOOL, BF16),
    ("sub", (3, 4), U8, (3, 4), F64, F64),
    ("add", (3, 4), I64, 2.5, None, F32),
    ("mul", (3, 4), U8, 0.5, None, F32),
    ("add", (3, 4), I16, (), F64, F64),
    ("add", (3, 4), BOOL, (), F16, F16),
    ("add", (3, 4), F16, (), F32, F16),
    ("mul", (3, 4), BF16, (), I64, BF16),
    ("add", (), F16, (), F32, F32),
    ("mul", (3, 4), F16, True, None, F16),
    ("add", (3, 4), F16, 3, None, F16),
    ("div", (3, 4), I64, (3, 4), I32, F32),
    ("div", (3, 4), I64, 3, None, F32),
    ("sub", (3, 4), F32, (3, 4), I16, F32),
]


def _operand(rng, shape, dtype):
    if not isinstance(shape, tuple):
        return shape  # a Python number
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":  # values that float16 and bfloat16 round (2049, 257 ...)
        return rng.integers(0 if dtype.kind == "u" else -3000, 3000 if dtype.itemsize > 1 else 100, shape).astype(dtype)
    return np.asarray(ref.random(rng, shape, dtype))  # 0-d: an array, not a NumPy scalar (a Python float)


def _bits(x):
    x = np.asarray(x)
    return x.view(f"u{x.dtype.itemsize}")


@pytest.mark.parametrize("op,shape_a,dtype_a,shape_b,dtype_b,want", PROMOTIONS,
                         ids=[f"{p[0]}-{p[1]}{p[2]}-{p[3]}{p[4]}" for p in PROMOTIONS])
def test_torch_type_promotion(rng, op, shape_a, dtype_a, shape_b, dtype_b, want):
    """The result dtype torch gives, and the values of torch's CUDA kernels bit for bit: every
    operand read in the compute type (float32; float64 for a float64 result), integers and bools
    converted to it, the op computed there and rounded once to the result dtype."""
    a, b = _operand(rng, shape_a, dtype_a), _operand(rng, shape_b, dtype_b)
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
    out = getattr(F, op)(a, b)
    assert out.dtype == want
    acc = F64 if want == F64 else F32
    common = [float(x) if isinstance(x, (bool, int, float)) else np.asarray(x).astype(acc) for x in (a, b)]
    with np.errstate(divide="ignore", invalid="ignore"):  # an integer divisor may draw 0: inf or nan, as torch's
        want_values = fn(*common).astype(want)
    np.testing.assert_array_equal(_bits(out), _bits(want_values))


@pytest.mark.parametrize("name,dtype", [("exp", I16), ("log", U8), ("sigmoid", BOOL), ("tanh", I64), ("exp", I32)])
def test_integers_to_floating_ops_give_float32(rng, name, dtype):
    """torch's unary floating ops take integer and bool arrays and give float32 (its default dtype)."""
    x = _operand(rng, (4, 5), dtype) % 50  # exp stays finite in float32
    if name == "log":
        x = x + 1
    out = getattr(F, name)(x)
    assert out.dtype == F32
    want = {"exp": np.exp, "log": np.log, "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh}[name]
    assert_close(out, want(x.astype(F64)), F32, what=name)


@pytest.mark.parametrize("call", [lambda i: F.add(i, i), lambda i: F.mul(i, 2), lambda i: F.relu(i),
                                  lambda i: F.mul(i, i > 0), lambda i: F.gelu(i.astype(np.float32) > 0)])
def test_integer_results_are_refused(rng, call):
    """Where torch's result would be an integer array, which ampc's kernels do not compute: a
    TypeError naming the op's argument."""
    with pytest.raises(TypeError, match=r"\w+: (input|other) must be a floating array"):
        call(rng.integers(-5, 5, (3, 4)))


def test_elementwise_output_takes_the_layout_of_its_first_full_shape_input(rng):
    """As torch and NumPy (order 'K'): a channels-last or transposed dense input gives an output in
    its layout; C order when the first full-shape input is C order or no input is dense."""
    x = ref.random(rng, (2, 4, 5, 6), F32).transpose(0, 3, 1, 2)  # dense, channels-last in memory
    y = ref.random(rng, (2, 6, 4, 5), F32)
    b = ref.random(rng, (6, 1, 1), F32)
    for out, want, like in [(F.add(x, y), f64(x) + f64(y), x), (F.add(y, x), f64(y) + f64(x), y),
                            (F.relu(x), np.maximum(f64(x), 0), x), (F.mul(x, b), f64(x) * f64(b), x),
                            (F.mul(b, x), f64(b) * f64(x), x), (F.exp(x.T), np.exp(f64(x).T), x.T),
                            (F.mul(x[::-1], -1.0), -f64(x)[::-1], y)]:
        assert out.strides == like.strides
        assert_close(out, want, F32)


def test_binary_shapes_that_do_not_broadcast(rng):
    with pytest.raises(ValueError, match="broadcast"):
        F.add(np.ones((3, 4), np.float32), np.ones((5,), np.float32))


# --------------------------------------------------------------------------------------------
# softmax, log_softmax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 5), 1), ((3, 5), 0), ((2, 3, 17), -1), ((2, 3, 17), 1),
                                       ((1, 1), 1), ((4, 300), 1)], ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax_forward(rng, shape, dim, log, dtype):
    x = ref.random(rng, shape, dtype, scale=3)
    op, reference = (F.log_softmax, ref.log_softmax) if log else (F.softmax, ref.softmax)
    expected = reference(f64(x), dim)
    scale = None if not log else np.abs(expected).max()
    assert_close(op(x, dim), expected, dtype, scale=scale)
    assert_close(op(np.swapaxes(np.swapaxes(x, 0, -1).copy(), 0, -1), dim), expected, dtype, scale=scale)
    # dtype= runs it in that dtype (torch's fp32_set_opt_dtype passes it)
    assert op(x, dim, dtype=np.float32).dtype == F32


@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_backward(rng, log, dim):
    x = rng.standard_normal((3, 4, 5))
    r = rng.standard_normal(x.shape)
    fwd = (lambda v: F.log_softmax(v, dim)) if log else (lambda v: F.softmax(v, dim))
    bwd = F.log_softmax_backward if log else F.softmax_backward
    assert_close(bwd(r, fwd(x), dim), numeric_grad(fwd, x.copy(), r), F64, rtol=1e-6)
    # low precision: from the output in bfloat16, the gradient in bfloat16
    xb = x.astype(BF16)
    yb = fwd(xb)
    gb = r.astype(BF16)
    assert_close(bwd(gb, yb, dim), bwd(f64(gb), f64(yb), dim), BF16, scale=np.abs(bwd(f64(gb), f64(yb), dim)).max())


def test_softmax_of_all_minus_inf_is_nan():
    out = F.softmax(np.full((2, 3), -np.inf, np.float32), 1)
    assert np.isnan(out).all()


@pytest.mark.parametrize("dtype", [F32, F64], ids=str)
def test_a_nan_anywhere_in_a_row_wins(rng, dtype):
    """A NaN at any position of a row (each lane of the vectorised maximum, and the tail past the
    last whole step of 8) makes softmax's, log_softmax's and cross_entropy's row NaN, beside -inf
    and +inf as well; the other rows keep their values."""
    n = 19
    for at in range(n):
        for other in (0.0, -np.inf, np.inf):
            x = ref.random(rng, (3, n), dtype)
            if other == -np.inf:
                x[1] = -np.inf  # the whole row, but for the NaN
            else:
                x[1, (at + 5) % n] = other
            x[1, at] = np.nan
            for out in (F.softmax(x, 1), F.log_softmax(x, 1)):
                assert np.isnan(out[1]).all(), (at, other)
                assert not np.isnan(out[[0, 2]]).any()
            loss = F.cross_entropy(x, np.array([0, 1, 2]), reduction="none")
            assert np.isnan(loss[1]) and not np.isnan(loss[[0, 2]]).any(), (at, other)


def test_softmax_dim_out_of_range():
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.softmax(np.ones((2, 3), np.float32), 2)


# --------------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,nshape", [((4, 7), (7,)), ((2, 3, 17), (3, 17)), ((5, 1), (1,)), ((3, 768), (768,))],
                         ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_forward(rng, shape, nshape, affine, dtype):
    x = ref.random(rng, shape, dtype, scale=2) + dtype.type(1)
    w = ref.random(rng, nshape, dtype) if affine else None
    b = ref.random(rng, nshape, dtype) if affine else None
    expected = ref.layer_norm(f64(x), len(nshape), None if w is None else f64(w), None if b is None else f64(b))
    y = F.layer_norm(x, nshape, w, b)  # without the statistics the backward would need: the same bits
    assert_close(y, expected, dtype, rtol=2 * ref.RTOL[dtype])
    np.testing.assert_array_equal(y, _bare_ops.layer_norm_forward(x, nshape, w, b)[0])
    if shape[-1] > 1:
        strided = np.asfortranarray(x)
        assert_close(F.layer_norm(strided, nshape, w, b), expected, dtype, rtol=2 * ref.RTOL[dtype])


def test_layer_norm_backward_finite_differences(rng):
    x = rng.standard_normal((4, 6))
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    r = rng.standard_normal(x.shape)
    gi, gw, gb = F.layer_norm_backward(r, x, (6,), w, b)
    assert_close(gi, numeric_grad(lambda v: F.layer_norm(v, (6,), w, b), x.copy(), r), F64, rtol=1e-6)
    assert_close(gw, numeric_grad(lambda v: F.layer_norm(x, (6,), v, b), w.copy(), r), F64, rtol=1e-6)
    assert_close(gb, numeric_grad(lambda v: F.layer_norm(x, (6,), w, v), b.copy(), r), F64, rtol=1e-6)
    gi2, gw2, gb2 = F.layer_norm_backward(r, x, (6,))
    assert gw2 is None and gb2 is None
    assert_close(gi2, numeric_grad(lambda v: F.layer_norm(v, (6,)), x.copy(), r), F64, rtol=1e-6)


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
def test_layer_norm_backward_low_precision(rng, dtype):
    x = ref.random(rng, (37, 96), dtype)
    w, b = ref.random(rng, (96,), dtype), ref.random(rng, (96,), dtype)
    g = ref.random(rng, x.shape, dtype)
    y, mean, rstd = _bare_ops.layer_norm_forward(x, (96,), w, b)
    assert mean.dtype == F32 and rstd.dtype == F32
    gi, gw, gb = F.layer_norm_backward(g, x, (96,), w, b, mean=mean, rstd=rstd)
    ei, ew, eb = F.layer_norm_backward(f64(g), f64(x), (96,), f64(w), f64(b))
    assert_close(gi, ei, dtype, scale=np.abs(ei).max(), rtol=4 * ref.RTOL[dtype])
    assert_close(gw, ew, dtype, scale=np.abs(ew).max(), rtol=4 * ref.RTOL[dtype])
    assert_close(gb, eb, dtype, scale=np.abs(eb).max(), rtol=4 * ref.RTOL[dtype])


def test_layer_norm_bad_shapes():
    x = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match="normalized_shape"):
        F.layer_norm(x, (5,))
    with pytest.raises(ValueError, match="weight has 3 elements"):
        F.layer_norm(x, (4,), np.ones(3, np.float32))


# --------------------------------------------------------------------------------------------
# cross_entropy, nll_loss
# --------------------------------------------------------------------------------------------

CE_CASES = [
    dict(shape=(5, 7)),
    dict(shape=(5, 7), reduction="sum"),
    dict(shape=(5, 7), reduction="none"),
    dict(shape=(6, 4), weight=True),
    dict(shape=(6, 4), weight=True, ignore=True),
    dict(shape=(6, 4), label_smoothing=0.1),
    dict(shape=(6, 4), label_smoothing=0.2, weight=True, ignore=True),
    dict(shape=(3, 5, 2, 3)),                          # spatial: (N, C, d1, d2)
    dict(shape=(3, 5, 4), reduction="none", weight=True),
    dict(shape=(9,)),                                  # one sample, no batch dimension
    dict(shape=(4, 6), probs=True),
    dict(shape=(4, 6), probs=True, label_smoothing=0.3, weight=True),
    dict(shape=(2, 3, 5), probs=True, reduction="none"),
    dict(shape=(2, 50257)),                            # GPT-2's vocabulary
]


def _ce_inputs(rng, case, dtype):
    shape = case["shape"]
    c = shape[0] if len(shape) == 1 else shape[1]
    x = ref.random(rng, shape, dtype, scale=2)
    if case.get("probs"):
        p = rng.random(shape)
        target = (p / p.sum(axis=0 if len(shape) == 1 else 1, keepdims=True)).astype(dtype)
    else:
        tshape = () if len(shape) == 1 else (shape[0],) + shape[2:]
        target = rng.integers(0, c, tshape)
        if case.get("ignore"):
            target.reshape(-1)[::3] = -100
    weight = (rng.random(c) + 0.5).astype(dtype) if case.get("weight") else None
    kwargs = dict(reduction=case.get("reduction", "mean"), label_smoothing=case.get("label_smoothing", 0.0))
    return x, target, weight, kwargs


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("case", CE_CASES, ids=str)
def test_cross_entropy_forward(rng, case, dtype):
    x, target, weight, kw = _ce_inputs(rng, case, dtype)
    expected = ref.cross_entropy(f64(x), f64(target) if case.get("probs") else target,
                                 None if weight is None else f64(weight), **kw)
    out = F.cross_entropy(x, target, weight, **kw)
    assert_close(out, expected, dtype, rtol=2 * ref.RTOL[dtype])


@pytest.mark.parametrize("case", CE_CASES[:-1], ids=str)
def test_cross_entropy_backward_finite_differences(rng, case):
    x, target, weight, kw = _ce_inputs(rng, case, F64)
    out = F.cross_entropy(x, target, weight, **kw)
    r = rng.standard_normal(np.shape(out))
    g = F.cross_entropy_backward(r, x, target, weight, **kw)
    expected = numeric_grad(lambda v: F.cross_entropy(v, target, weight, **kw), x.copy(), r)
    assert_close(g, expected, F64, rtol=1e-6, scale=np.abs(expected).max())


@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=str)
def test_cross_entropy_backward_low_precision(rng, dtype):
    x, target, weight, kw = _ce_inputs(rng, dict(shape=(16, 33), weight=True, label_smoothing=0.1), dtype)
    g = F.cross_entropy_backward(np.float32(1.5), x, target, weight, **kw)
    e = F.cross_entropy_backward(np.float64(1.5), f64(x), target, f64(weight), **kw)
    assert_close(g, e, dtype, scale=np.abs(e).max())


@pytest.mark.parametrize("dtypes", [(F16, F32), (BF16, F32), (F32, F64), (F16, F64)], ids=str)
def test_cross_entropy_probability_targets_of_a_wider_dtype(rng, dtypes):
    """float16 logits with float32 probabilities: a float32 loss, as torch's (its promotion of the
    log-probabilities and the targets), from the logits' values (it was rounded to float16); the
    gradient in the logits' dtype."""
    low, wide = dtypes
    x = ref.random(rng, (6, 9), low, scale=2)
    p = rng.random((6, 9))
    target = (p / p.sum(1, keepdims=True)).astype(wide)
    for reduction in ("mean", "sum", "none"):
        out = F.cross_entropy(x, target, reduction=reduction)
        assert out.dtype == wide
        expected = ref.cross_entropy(f64(x), f64(target), reduction=reduction)
        assert_close(out, expected, wide, rtol=4 * ref.RTOL[wide])
    assert F.cross_entropy_backward(np.float32(1.0), x, target).dtype == low


def test_nll_loss_forward_and_backward(rng):
    for dtype in FLOATS:
        logp = ref.log_softmax(ref.random(rng, (6, 5), F64), 1).astype(dtype)
        t = rng.integers(0, 5, 6)
        t[2] = -100
        w = (rng.random(5) + 0.5).astype(dtype)
        for reduction in ("mean", "sum", "none"):
            expected = ref.nll_loss(f64(logp), t, f64(w), reduction=reduction)
            assert_close(F.nll_loss(logp, t, w, reduction=reduction), expected, dtype, rtol=2 * ref.RTOL[dtype])
    x = rng.standard_normal((4, 3))
    t = rng.integers(0, 3, 4)
    r = rng.standard_normal(())
    assert_close(F.nll_loss_backward(r, x, t), numeric_grad(lambda v: F.nll_loss(v, t), x.copy(), r), F64, rtol=1e-6)


def test_cross_entropy_bad_targets():
    x = np.zeros((3, 4), np.float32)
    x_before = x.copy()
    with pytest.raises(ValueError, match="out of bounds"):
        F.cross_entropy(x, np.array([0, 4, 1]))
    with pytest.raises(ValueError, match="out of bounds"):
        F.cross_entropy(x, np.array([0, -1, 1]))
    with pytest.raises(TypeError, match="class indices"):
        F.nll_loss(x, np.array([0.0, 1.0, 1.0], np.float32))
    with pytest.raises(ValueError, match="target"):
        F.cross_entropy(x, np.array([0, 1]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(x, np.array([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(x, np.array([0, 1, 2]), label_smoothing=1.5)
    np.testing.assert_array_equal(x, x_before)


def test_cross_entropy_all_ignored_is_nan():
    out = F.cross_entropy(np.zeros((2, 3), np.float32), np.array([-100, -100]))
    assert np.isnan(out)


# --------------------------------------------------------------------------------------------
# Pointwise losses
# --------------------------------------------------------------------------------------------

POINTWISE = [
    ("mse_loss", F.mse_loss, F.mse_loss_backward, lambda x, y: (x - y) ** 2, False),
    ("l1_loss", F.l1_loss, F.l1_loss_backward, lambda x, y: np.abs(x - y), False),
    ("bce_with_logits", F.binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits_backward,
     ref.bce_with_logits, True),
    ("bce", F.binary_cross_entropy, F.binary_cross_entropy_backward, ref.bce, True),
]


def _loss_inputs(rng, name, shape, dtype):
    x = ref.random(rng, shape, dtype)
    if name == "bce":
        x = (1 / (1 + np.exp(-f64(x)))).astype(dtype)
    y = rng.random(shape).astype(dtype) if name.startswith("bce") else ref.random(rng, shape, dtype)
    return x, y


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name,fwd,bwd,per,_", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_loss_forward(rng, name, fwd, bwd, per, _, reduction, dtype):
    x, y = _loss_inputs(rng, name, (5, 13), dtype)
    expected = ref.reduce(per(f64(x), f64(y)), reduction)
    assert_close(fwd(x, y, reduction=reduction), expected, dtype, rtol=2 * ref.RTOL[dtype])


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name,fwd,bwd,per,weighted", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_loss_backward(rng, name, fwd, bwd, per, weighted, reduction):
    x, y = _loss_inputs(rng, name, (3, 4), F64)
    if name == "l1_loss":
        x[np.abs(x - y) < 1e-3] += 0.1
    r = rng.standard_normal(np.shape(fwd(x, y, reduction=reduction)))
    assert_close(bwd(r, x, y, reduction=reduction),
                 numeric_grad(lambda v: fwd(v, y, reduction=reduction), x.copy(), r), F64, rtol=1e-6)
    if weighted:
        w = rng.random((3, 4)) + 0.5
        assert_close(fwd(x, y, w, reduction=reduction), ref.reduce(per(x, y, w), reduction), F64)
        assert_close(bwd(r, x, y, w, reduction=reduction),
                     numeric_grad(lambda v: fwd(v, y, w, reduction=reduction), x.copy(), r), F64, rtol=1e-6)


def _bce_pos_weight_reference(x, y, p, w=None):
    """torch's documented form: -w [p y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))]."""
    log_sig, log_one_minus = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    per = -(p * y * log_sig + (1 - y) * log_one_minus)
    return per if w is None else per * w


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_bce_with_logits_pos_weight(rng, dtype, reduction, weighted):
    """pos_weight (one per class, broadcast over the last dimension): the loss against torch's
    documented form in float64, its gradient against finite differences."""
    x, y = _loss_inputs(rng, "bce_with_logits", (6, 5), dtype)
    p = (rng.random(5) * 3).astype(dtype)
    w = (rng.random(5) + 0.5).astype(dtype) if weighted else None
    want = ref.reduce(_bce_pos_weight_reference(f64(x), f64(y), f64(p), None if w is None else f64(w)), reduction)
    got = F.binary_cross_entropy_with_logits(x, y, w, reduction=reduction, pos_weight=p)
    assert got.dtype == dtype
    assert_close(got, want, dtype, rtol=4 * ref.RTOL[dtype])
    x, y, p = f64(x), f64(y), f64(p)
    w = None if w is None else f64(w)
    r = rng.standard_normal(np.shape(want))
    fwd = lambda v: F.binary_cross_entropy_with_logits(v, y, w, reduction=reduction, pos_weight=p)  # noqa: E731
    assert_close(F.binary_cross_entropy_with_logits_backward(r, x, y, w, reduction, pos_weight=p),
                 numeric_grad(fwd, x.copy(), r), F64, rtol=1e-6)


@pytest.mark.parametrize("loss", [F.mse_loss, F.l1_loss, F.binary_cross_entropy, F.binary_cross_entropy_with_logits,
                                  lambda x, y: F.binary_cross_entropy(x, y, weight=np.ones(4, np.float32)),
                                  lambda x, y: F.binary_cross_entropy_with_logits(x, y, weight=np.ones(4, np.float32))],
                         ids=["mse", "l1", "bce", "bce_logits", "bce_weighted", "bce_logits_weighted"])
def test_loss_shape_mismatch(loss):
    """A target that would broadcast against input is refused (torch: ValueError), weighted or not:
    the weighted binary_cross_entropy broadcast it silently."""
    x = np.full((3, 4), 0.5, np.float32)
    with pytest.raises(ValueError, match="same shape"):
        loss(x, np.full((4,), 0.25, np.float32))


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("dim", [None, 0, 1, 2, (0, 2), (0, 1), (-1,), (0, 1, 2)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean(rng, dim, keepdim, dtype):
    x = ref.random(rng, (3, 40, 7), dtype)
    axes = dim if dim is None or isinstance(dim, tuple) else (dim,)
    s = f64(x).sum(axis=axes, keepdims=keepdim)
    scale = np.abs(f64(x)).sum(axis=axes, keepdims=keepdim)
    assert_close(F.sum(x, dim, keepdim), s, dtype, scale=scale, rtol=2 * ref.RTOL[dtype])
    assert_close(F.mean(x, dim, keepdim), f64(x).mean(axis=axes, keepdims=keepdim), dtype,
                 scale=scale / (x.size / np.size(s)), rtol=2 * ref.RTOL[dtype])
    assert F.sum(x, dim, keepdim, dtype=np.float32).dtype == F32


def test_an_empty_dim_list_reduces_every_dimension(rng):
    """torch's sum(x, ()) and mean(x, []) reduce over every dimension (they returned x)."""
    x = ref.random(rng, (3, 4), F32)
    for dim in ((), []):
        assert_close(F.sum(x, dim), f64(x).sum(), F32, scale=np.abs(f64(x)).sum())
        assert_close(F.mean(x, dim, keepdim=True), f64(x).mean(keepdims=True), F32, scale=np.abs(f64(x)).mean())
        assert F.sum_backward(np.float32(2.0), x.shape, dim).shape == x.shape


@pytest.mark.parametrize("op", ["sum", "mean", "softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [F32, BF16, np.dtype(np.int32)], ids=str)
def test_dtype_float64_computes_in_float64(rng, op, dtype):
    """dtype=float64 casts the input first, as torch: the kernels then compute in float64 (a float32
    sum of 30000 float32 values written as float64 was 1e-7 off), and integer inputs are taken."""
    x = ref.random(rng, (5, 30000), F32) * 100
    x = x.astype(dtype) if dtype.kind != "i" else np.rint(x).astype(dtype)
    got = getattr(F, op)(x, 1, dtype=np.float64)
    v = f64(x)
    want = {"sum": lambda: v.sum(1), "mean": lambda: v.mean(1),
            "softmax": lambda: np.exp(v - v.max(1, keepdims=True)) / np.exp(v - v.max(1, keepdims=True)).sum(1, keepdims=True),
            "log_softmax": lambda: v - v.max(1, keepdims=True) - np.log(np.exp(v - v.max(1, keepdims=True)).sum(1, keepdims=True))}[op]()
    assert got.dtype == F64
    scale = {"sum": np.abs(v).sum(1), "mean": np.abs(v).mean(1)}.get(op)
    assert_close(got, want, F64, scale=scale, rtol=1e-12)


def test_integers_to_a_float_power_give_float32(rng):
    """torch's pow of an integer array to a float is float32; to an integer it would be an integer array."""
    x = rng.integers(0, 20, (3, 4))
    out = F.pow(x, 1.5)
    assert out.dtype == F32
    assert_close(out, f64(x) ** 1.5, F32)
    with pytest.raises(TypeError, match="pow: input must be a floating array"):
        F.pow(x, 2)


def test_sum_long_rows_and_columns(rng):
    x = ref.random(rng, (3, 100003), F32)
    assert_close(F.sum(x, 1), f64(x).sum(1), F32, scale=np.abs(f64(x)).sum(1))
    y = ref.random(rng, (5000, 3), BF16)
    assert_close(F.sum(y, 0, dtype=np.float32), f64(y).sum(0), F32, scale=np.abs(f64(y)).sum(0))


@pytest.mark.parametrize("columns", [100, 2000], ids=lambda c: f"{c} columns")
def test_sum_down_long_columns_is_a_cascade(rng, columns):
    """Thousands of float32 values down each column (sum over dim 0): rows added one after another
    erred by about n/16 roundings (5x torch's cascade sum at 10^7 values, 2^-21 relative and more
    here); the cascade keeps the error near a few roundings (about 2^-22)."""
    x = (rng.random((2**20 // columns * 4, columns)) + 0.5).astype(np.float32)
    exact = x.astype(np.float64).sum(0)
    error = np.abs(np.asarray(F.sum(x, 0), np.float64) - exact) / exact
    assert error.max() < 2.0**-21, error.max()


def test_sum_backward(rng):
    x = rng.standard_normal((3, 4, 5))
    for dim, keepdim in [((0, 2), False), (1, True), (None, False)]:
        r = rng.standard_normal(np.shape(F.sum(x, dim, keepdim)))
        assert_close(F.sum_backward(r, x.shape, dim, keepdim),
                     numeric_grad(lambda v: F.sum(v, dim, keepdim), x.copy(), r), F64, rtol=1e-6)
        assert_close(F.mean_backward(r, x.shape, dim, keepdim),
                     numeric_grad(lambda v: F.mean(v, dim, keepdim), x.copy(), r), F64, rtol=1e-6)


def test_threads_do_not_change_the_bits(rng):
    x = ref.random(rng, (257, 1031), F32)
    g = ref.random(rng, (257, 1031), F32)
    t = rng.integers(0, 1031, 257)
    results = []
    old = ampc.get_num_threads()
    try:
        for n in (1, 2, 3):
            ampc.set_num_threads(n)
            results.append([F.sum(x), F.sum(x, 0), F.layer_norm_backward(g, x, (1031,), x[0], x[1])[1],
                            F.cross_entropy(x, t), F.softmax(x, 0)])
    finally:
        ampc.set_num_threads(old)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(bits(a), bits(b))


# --------------------------------------------------------------------------------------------
# Matrix products
# --------------------------------------------------------------------------------------------


def _mm_scale(a, b):
    """|a| @ |b|: the magnitude of the terms each output sums."""
    return np.abs(f64(a)) @ np.abs(f64(b))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("xshape", [(5, 7), (2, 3, 7), (1, 7), (7,)], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_linear(rng, xshape, bias, dtype):
    x = ref.random(rng, xshape, dtype)
    w = ref.random(rng, (4, 7), dtype)
    b = ref.random(rng, (4,), dtype) if bias else None
    expected = f64(x) @ f64(w).T + (f64(b) if bias else 0)
    scale = _mm_scale(x, w.T) + (np.abs(f64(b)) if bias else 0)
    assert_close(F.linear(x, w, b), expected, dtype, scale=scale)
    assert_close(F.linear(noncontiguous(x), w, b), expected, dtype, scale=scale)


def test_a_float64_input_to_a_float32_layer_is_told_what_to_do(rng):
    """NumPy's default dtype meeting a float32 model: torch's text, then the fix. A mismatch without
    float64 keeps torch's text alone."""
    x, w = rng.standard_normal((3, 8)), rng.standard_normal((4, 8)).astype(np.float32)
    hint = r"\(NumPy makes float64 arrays by default, .* x\.astype\(numpy\.float32\)\)$"
    with pytest.raises(TypeError, match="got float64 for input and float32 for other " + hint):
        F.linear(x, w)
    with pytest.raises(TypeError, match="got float64 and float32 " + hint):
        F.conv2d(x.reshape(1, 3, 2, 4), w.reshape(4, 2, 2, 2)[:, :1].repeat(3, axis=1))
    with pytest.raises(TypeError, match="got float16 for input and float32 for other$"):
        F.linear(x.astype(np.float16), w)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("xshape,bshape", [((5, 7), (1, 4)), ((5, 7), (5, 4)), ((5, 7), (5, 1)), ((5, 7), (1,)),
                                           ((2, 3, 7), (3, 4)), ((2, 3, 7), (2, 1, 4)), ((2, 3, 7), ())], ids=str)
def test_linear_takes_a_bias_that_broadcasts(rng, xshape, bshape, dtype):
    """torch's linear adds any bias that broadcasts to its output (torch's own autocast list passes a
    square matrix): ampc refused all but (out_features,). Forward against float64, backward against
    finite differences, the bias gradient summed down to the bias's shape."""
    x, w, b = ref.random(rng, xshape, dtype), ref.random(rng, (4, 7), dtype), ref.random(rng, bshape, dtype)
    expected = f64(x) @ f64(w).T + f64(b)
    assert_close(F.linear(x, w, b), expected, dtype, scale=_mm_scale(x, w.T) + np.abs(f64(b)))
    x, w, b = (rng.standard_normal(s) for s in (xshape, (4, 7), bshape))
    r = rng.standard_normal(xshape[:-1] + (4,))
    gi, gw, gb = F.linear_backward(r, x, w, bias_shape=bshape)
    assert gb.shape == bshape and gb is not r
    assert_close(gb, numeric_grad(lambda v: F.linear(x, w, v), np.array(b), r), F64, rtol=1e-6)
    assert_close(gw, numeric_grad(lambda v: F.linear(x, v, b), w.copy(), r), F64, rtol=1e-6)
    # on the tape: the Parameter's .grad has the bias's shape
    bias = ampc.Parameter(np.array(b))
    F.linear(x, w, bias).backward(r)
    assert_close(bias.grad, gb, F64, rtol=1e-12)


def test_matmul_output_past_int64_is_refused_before_any_product_of_its_sizes():
    """Broadcast batches whose product with m and n passes 2**63 bytes (the GPU multiplied them into
    cuBLASLt's batch count first): one ValueError naming the op."""
    zeros = np.zeros(1, np.float32)
    a = np.lib.stride_tricks.as_strided(zeros, (2**31, 1, 1, 2), (0, 0, 0, 4))
    b = np.lib.stride_tricks.as_strided(zeros, (1, 2**31, 2, 1), (0, 0, 0, 4))
    with pytest.raises(ValueError, match="matmul: the output's broadcast batch and matrices are too large"):
        F.matmul(a, b)


def test_linear_of_torch_autocast_list_under_autocast(rng):
    """torch's autocast test list calls linear(mat0, mat1, mat2) on three square float32 matrices:
    under CPU autocast, bfloat16, the bias added in float32 and rounded once."""
    m = [rng.standard_normal((8, 8)).astype(np.float32) for _ in range(3)]
    with ampc.autocast("cpu"):
        y = F.linear(*m)
    assert y.dtype == BF16
    lo = [f64(v.astype(BF16)) for v in m]
    assert_close(y, lo[0] @ lo[1].T + lo[2], BF16, scale=np.abs(lo[0]) @ np.abs(lo[1]).T + np.abs(lo[2]))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("ashape,bshape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                           ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)), ((3, 4), (4,)),
                                           ((4,), (4,)), ((2, 3, 4), (4,))], ids=str)
def test_matmul(rng, ashape, bshape, dtype):
    a, b = ref.random(rng, ashape, dtype), ref.random(rng, bshape, dtype)
    expected = np.matmul(f64(a), f64(b))
    assert_close(F.matmul(a, b), expected, dtype, scale=np.matmul(np.abs(f64(a)), np.abs(f64(b))))


def test_mm_bmm_addmm_baddbmm(rng):
    for dtype in FLOATS:
        a, b = ref.random(rng, (3, 4), dtype), ref.random(rng, (4, 5), dtype)
        assert_close(F.mm(a, b), f64(a) @ f64(b), dtype, scale=_mm_scale(a, b))
        assert_close(F.mm(a, b.T.copy().T), f64(a) @ f64(b), dtype, scale=_mm_scale(a, b))  # transposed storage
        c = ref.random(rng, (5,), dtype)
        assert_close(F.addmm(c, a, b, beta=0.5, alpha=2), 0.5 * f64(c) + 2 * (f64(a) @ f64(b)), dtype,
                     scale=2 * _mm_scale(a, b) + np.abs(f64(c)))
        assert_close(F.addmm(c, a, b, alpha=0), f64(c) + 0 * f64(a) @ f64(b), dtype)
        x, y = ref.random(rng, (2, 3, 4), dtype), ref.random(rng, (2, 4, 6), dtype)
        z = ref.random(rng, (2, 3, 6), dtype)
        assert_close(F.bmm(x, y), f64(x) @ f64(y), dtype, scale=np.abs(f64(x)) @ np.abs(f64(y)))
        assert_close(F.baddbmm(z, x, y, beta=-1), -f64(z) + f64(x) @ f64(y), dtype,
                     scale=np.abs(f64(x)) @ np.abs(f64(y)) + np.abs(f64(z)))


def test_beta_or_alpha_zero_reads_nothing_of_its_term(rng):
    """As BLAS and torch: beta=0 ignores input (its NaN and inf do not reach the result), alpha=0
    the product; input must still broadcast."""
    a, b = ref.random(rng, (3, 4), F32), ref.random(rng, (4, 5), F32)
    nan = np.full((3, 5), np.nan, F32)
    assert_close(F.addmm(nan, a, b, beta=0), f64(a) @ f64(b), F32, scale=_mm_scale(a, b))
    assert_close(F.baddbmm(nan[None], a[None], b[None], beta=0, alpha=2), 2 * (f64(a) @ f64(b))[None], F32,
                 scale=2 * _mm_scale(a, b))
    c = ref.random(rng, (5,), F32)
    assert_close(F.addmm(c, a, np.full((4, 5), np.inf, F32), alpha=0, beta=3), np.broadcast_to(3 * f64(c), (3, 5)), F32)
    assert not F.addmm(nan, a, np.full((4, 5), np.inf, F32), alpha=0, beta=0).any()
    with pytest.raises(ValueError, match="addmm: input of size 4 cannot be broadcast to size 5"):
        F.addmm(np.ones(4, F32), a, b, beta=0)


def test_matmul_rounds_once_in_low_precision(rng):
    """bfloat16 in, bfloat16 out: the float32 product rounded once, not bfloat16 partial sums."""
    a, b = ref.random(rng, (8, 512), BF16), ref.random(rng, (512, 8), BF16)
    exact = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(F.mm(a, b).view(np.uint16), exact.view(np.uint16))


def test_linear_backward_finite_differences(rng):
    x, w, b = rng.standard_normal((2, 3, 5)), rng.standard_normal((4, 5)), rng.standard_normal(4)
    r = rng.standard_normal((2, 3, 4))
    gi, gw, gb = F.linear_backward(r, x, w)
    assert_close(gi, numeric_grad(lambda v: F.linear(v, w, b), x.copy(), r), F64, rtol=1e-6)
    assert_close(gw, numeric_grad(lambda v: F.linear(x, v, b), w.copy(), r), F64, rtol=1e-6)
    assert_close(gb, numeric_grad(lambda v: F.linear(x, w, v), b.copy(), r), F64, rtol=1e-6)


@pytest.mark.parametrize("xshape", [(2, 3, 5), (5,)], ids=str)
def test_linear_of_one_feature(rng, xshape):
    """A 1-D weight (in_features,) with a 0-d bias: torch's single output feature, its dimension
    dropped (ampc refused it: 'a transposed operand needs 2 dimensions'); forward and backward."""
    x, w, b = rng.standard_normal(xshape), rng.standard_normal(5), np.asarray(rng.standard_normal())
    y = F.linear(x, w, b)
    assert y.shape == xshape[:-1]
    assert_close(y, f64(x) @ w + b, F64)
    r = rng.standard_normal(xshape[:-1])
    gi, gw, gb = F.linear_backward(r, x, w)
    assert gi.shape == x.shape and gw.shape == w.shape and gb.shape == ()
    assert_close(gi, numeric_grad(lambda v: F.linear(v, w, b), x.copy(), r), F64, rtol=1e-6)
    assert_close(gw, numeric_grad(lambda v: F.linear(x, v, b), w.copy(), r), F64, rtol=1e-6)
    assert_close(gb, np.sum(r), F64, rtol=1e-12)


def test_matmul_backward_finite_differences(rng):
    for ashape, bshape in [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((4,), (4, 5)),
                           ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4,)), ((4,), (2, 4, 5))]:
        a, b = rng.standard_normal(ashape), rng.standard_normal(bshape)
        r = rng.standard_normal(np.matmul(a, b).shape)
        ga, gb = F.matmul_backward(r, a, b)
        assert_close(ga, numeric_grad(lambda v: F.matmul(v, b), a.copy(), r), F64, rtol=1e-6)
        assert_close(gb, numeric_grad(lambda v: F.matmul(a, v), b.copy(), r), F64, rtol=1e-6)


def test_matmul_bad_input():
    a = np.ones((3, 4), np.float32)
    with pytest.raises(ValueError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x4 and 5x6\)"):
        F.mm(a, np.ones((5, 6), np.float32))
    with pytest.raises(TypeError, match="floating"):
        F.mm(np.ones((3, 4), np.int64), np.ones((4, 2), np.int64))
    with pytest.raises(TypeError, match="same dtype"):
        F.mm(a, np.ones((4, 2), np.float16))
    with pytest.raises(ValueError, match="2-D"):
        F.mm(a, np.ones(4, np.float32))
    with pytest.raises(ValueError, match=r"bias of shape \(2,\) does not broadcast to the output's shape \(3, 3\)"):
        F.linear(a, np.ones((3, 4), np.float32), np.ones(2, np.float32))
    with pytest.raises(ValueError, match=r"bias of shape \(2, 3, 3\) does not broadcast"):  # it would grow y
        F.linear(a, np.ones((3, 4), np.float32), np.ones((2, 3, 3), np.float32))


# --------------------------------------------------------------------------------------------
# Under autocast: the dtype PyTorch's lists choose, bit-exact against casting by hand
# --------------------------------------------------------------------------------------------


def _cpu_case(name, rng):
    """(op, args, kwargs) of an ampc.nn.functional op in float32."""
    x = ref.random(rng, (4, 6), F32)
    w = ref.random(rng, (5, 6), F32)
    t = rng.integers(0, 6, 4)
    cases = {
        "linear": (F.linear, (x, w), {}),
        "matmul": (F.matmul, (x, w.T), {}),
        "mm": (F.mm, (x, w.T), {}),
        "bmm": (F.bmm, (x[None], w.T[None]), {}),
        "addmm": (F.addmm, (x[:, :5], x, w.T), {}),
        "baddbmm": (F.baddbmm, (x[None, :, :5], x[None], w.T[None]), {}),
        "softmax": (F.softmax, (x, 1), {}),
        "log_softmax": (F.log_softmax, (x, 1), {}),
        "layer_norm": (F.layer_norm, (x, (6,)), {}),
        "cross_entropy": (F.cross_entropy, (x, t), {}),
        "nll_loss": (F.nll_loss, (x, t), {}),
        "mse_loss": (F.mse_loss, (x, x[::-1]), {}),
        "l1_loss": (F.l1_loss, (x, x[::-1]), {}),
        "binary_cross_entropy_with_logits": (F.binary_cross_entropy_with_logits, (x, np.abs(x) % 1), {}),
        "sum": (F.sum, (x,), {}),
        "exp": (F.exp, (x,), {}),
        "pow": (F.pow, (x, 2.0), {}),
    }
    return cases[name]


@pytest.mark.parametrize("name", ["linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "softmax", "log_softmax",
                                  "layer_norm", "cross_entropy", "nll_loss", "mse_loss", "l1_loss",
                                  "binary_cross_entropy_with_logits", "sum", "exp", "pow"])
def test_cpu_autocast_dtype_and_bits(rng, name):
    """Inside ampc.autocast("cpu") each op runs in the dtype torch's CPU lists give its name, and
    its result is bit for bit the op run outside on inputs cast by hand."""
    op, args, kwargs = _cpu_case(name, rng)
    policy = ampc.autocast_policy(name, "cpu")
    with ampc.autocast("cpu", dtype=ampc.bfloat16):
        out = op(*args, **kwargs)
    if policy == "lower_precision_fp":
        assert out.dtype == BF16
        cast = [a.astype(BF16) if isinstance(a, np.ndarray) and a.dtype == F32 else a for a in args]
        expected = op(*cast, **kwargs)
    else:
        expected = op(*args, **kwargs)
    assert out.dtype == np.asarray(expected).dtype
    np.testing.assert_array_equal(bits(out), bits(expected))


def test_cpu_autocast_from_bfloat16_inputs(rng):
    """fp32 ops cast bfloat16 inputs up; lower-precision ops keep them."""
    x = ref.random(rng, (4, 6), BF16)
    t = rng.integers(0, 6, 4)
    with ampc.autocast("cpu"):
        assert F.cross_entropy(x, t).dtype == F32  # torch's CPU fp32 list
        assert F.linear(x, x[:3]).dtype == BF16
        assert F.relu(x).dtype == BF16  # not listed: runs in its input's dtype


def test_binary_cross_entropy_on_cpu_autocast(rng):
    p = (rng.random((3, 4)) * 0.9 + 0.05).astype(np.float32)
    y = rng.random((3, 4)).astype(np.float32)
    with ampc.autocast("cpu"):
        out = F.binary_cross_entropy(p.astype(BF16), y.astype(BF16))
    assert out.dtype == F32  # fp32 on the CPU; banned only on CUDA


def test_errors_leave_inputs_unchanged(rng):
    x = ref.random(rng, (3, 4), F32)
    before = x.copy()
    for call in [lambda: F.linear(x, x[:, :3]), lambda: F.softmax(x, 5), lambda: F.cross_entropy(x, np.array([9, 0, 0])),
                 lambda: F.layer_norm(x, (3,)), lambda: F.add(x, np.ones(3, np.float32))]:
        with pytest.raises((ValueError, TypeError, IndexError)):
            call()
    np.testing.assert_array_equal(x, before)


def test_math_reference_sanity():
    # the reference's own gelu against a known value
    assert abs(ref.gelu(np.array([1.0]))[0] - 0.8413447460685429) < 1e-15
    assert math.isclose(ref.gelu_tanh(np.array([1.0]))[0], 0.8411919906082768, rel_tol=1e-12)
