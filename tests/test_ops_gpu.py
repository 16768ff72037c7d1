"""ampc.nn.functional on CUDA tensors: every op, forward and backward, against torch's on the same
inputs (same output dtype, values within the dtype's rounding of each other) and against a float64
reference (torch's op on the inputs converted to float64), at odd sizes, size 1, long rows (the
block-per-row kernels), strided rows and non-contiguous inputs; torch's autocast dtype for each op
name; bad input on the GPU."""

import math

import pytest

import ampc
import ops_reference as ref

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
TF = torch.nn.functional
F = ampc.nn.functional

FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
LOW = [torch.float16, torch.bfloat16]
RTOL = {torch.float32: 1e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7, torch.float64: 1e-12}
ID = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


@pytest.fixture(autouse=True)
def seed(test_seed):
    torch.manual_seed(test_seed)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=torch.float64) * scale).to(dtype)


def strided(x):
    """The same values every other element of a wider tensor, NaN in the gaps."""
    wide = torch.full(x.shape[:-1] + (2 * x.shape[-1],), float("nan"), device="cuda", dtype=x.dtype)
    wide[..., ::2] = x
    return wide[..., ::2]


def close(got, ref, dtype, *, scale=None, rtol=None, what=""):
    """got (a CUDA tensor of dtype) within rtol * (|ref| + scale) of ref, element by element."""
    assert isinstance(got, torch.Tensor) and got.is_cuda, f"{what}: {type(got)}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    g, r = got.double(), ref.double()
    rtol = RTOL[dtype] if rtol is None else rtol
    if scale is None:
        finite = r[r.isfinite()]
        scale = finite.abs().max().item() if finite.numel() else 0.0
    # Rounding to the format errs by up to half its smallest (subnormal) step however close the sum
    # was: a float16 product of 2^-20 and 2^-10 cannot come nearer than 2^-25.
    info = torch.finfo(dtype)
    tol = rtol * (r.abs() + scale) + max(info.tiny * info.eps / 2, 1e-300)
    assert torch.equal(g.isnan(), r.isnan()), f"{what}: NaN where the reference has none (or the other way)"
    bad = ~((g == r) | ((g - r).abs() <= tol)) & ~r.isnan()  # g == r: equal infinities
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} off, worst "
                           f"{(g - r).abs()[bad].max().item():.3g} at tolerance {tol[bad].min().item():.3g}")


def against(got, torch_fn, inputs, dtype, *, rtol=None, scale=None, what=""):
    """ampc's result against torch's in the same dtype and against torch's float64 reference."""
    want = torch_fn(*inputs)
    ref = torch_fn(*[x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs])
    assert got.dtype == want.dtype, f"{what}: ampc gives {got.dtype}, torch {want.dtype}"
    close(got, ref, dtype, rtol=rtol, scale=scale, what=f"{what} vs float64")
    close(got, want, dtype, rtol=2 * (RTOL[dtype] if rtol is None else rtol), scale=scale, what=f"{what} vs torch")


def autograd(fn, inputs, grad_output, wrt=None):
    """torch's gradients of fn at inputs (float64 copies) for grad_output, with respect to the
    floating inputs (or those whose indices are in wrt)."""
    leaves = [x.detach().double().requires_grad_(wrt is None or i in wrt)
              if isinstance(x, torch.Tensor) and x.is_floating_point() else x for i, x in enumerate(inputs)]
    out = fn(*leaves)
    out.backward(grad_output.double())
    return [x.grad if isinstance(x, torch.Tensor) and x.requires_grad else None for x in leaves]


# --------------------------------------------------------------------------------------------
# Elementwise
# --------------------------------------------------------------------------------------------

# the pointwise ops of ops_reference.POINTWISE that these lists name
UNARY = [(op.name, op.forward(F), op.torch(TF, torch)) for op in ref.pointwise("gpu")]
SIZES = [(1,), (7,), (33, 65), (1_000_003,)]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape", SIZES, ids=str)
@pytest.mark.parametrize("name,op,top", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, op, top, shape, dtype):
    x = randn(*shape, dtype=dtype)
    if name == "log":
        x = (x.abs() + 0.25).to(dtype)
    for inp in (x, strided(x)):
        against(op(inp), top, [inp], dtype, what=name)


BACKWARD = [(op.name, op.backward(F), op.torch(TF, torch)) for op in ref.pointwise("gpu_grad")]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("name,bwd,top", BACKWARD, ids=[b[0] for b in BACKWARD])
def test_unary_backward(name, bwd, top, dtype):
    x, g = randn(17, 301, dtype=dtype), randn(17, 301, dtype=dtype)
    (want,) = autograd(top, [x], g)
    got = bwd(g, x)
    close(got, want, dtype, rtol=2 * RTOL[dtype], what=name)
    x.requires_grad_(True)
    top(x).backward(g)
    assert got.dtype == x.grad.dtype


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_pow_array_exponent_gradients(dtype):
    """Both gradients of input ** exponent (broadcast; zeros in both, where torch's gradients have
    special cases), in the inputs' dtype, against torch's autograd in float64."""
    x = torch.rand(33, 1, 65, device="cuda", dtype=torch.float64) + 0.2
    x[:, :, ::7] = 0
    # exponents in [-3, 3]: below that, x ** (e - 1) at x = 0.2 takes the reduced input gradient past
    # float16's largest value (inf against a finite float64 reference, in about one draw of twenty)
    e = (randn(4, 1, dtype=torch.float64) * 2).clamp(-3, 3)
    e[0] = 0
    x, e = x.to(dtype), e.to(dtype)
    g = randn(33, 4, 65, dtype=dtype)
    want = autograd(torch.pow, [x, e], g)
    got_x, got_e = F.pow_backward(g, x, e), F.pow_exponent_backward(g, x, e)
    close(got_x.double().sum(1, keepdim=True).to(dtype), want[0], dtype, rtol=8 * RTOL[dtype], what="input's")
    close(got_e.double().sum((0, 2)).reshape(4, 1).to(dtype), want[1], dtype, rtol=8 * RTOL[dtype],
          what="exponent's")


def test_binary_broadcast_and_promotion():
    for da, db in [(torch.float32, torch.float32), (torch.float16, torch.float32), (torch.bfloat16, torch.float16),
                   (torch.float16, torch.float16), (torch.float64, torch.bfloat16)]:
        a, b = randn(3, 1, 5, dtype=da), randn(4, 5, dtype=db)
        dtype = torch.promote_types(da, db)
        against(F.add(a, b), torch.add, [a, b], dtype, what="add")
        against(F.add(a, b, alpha=0.5), lambda x, y: torch.add(x, y, alpha=0.5), [a, b], dtype, what="add alpha")
        against(F.sub(strided(a), b), torch.sub, [strided(a), b], dtype, what="sub")
        against(F.mul(a, b.t().contiguous().t()), torch.mul, [a, b], dtype, what="mul")
        against(F.div(a, b.abs() + 1), torch.div, [a, b.abs() + 1], dtype, what="div")
        against(F.mul(a, 2.5), lambda x: torch.mul(x, 2.5), [a], da, what="mul scalar")


def test_type_promotion_as_torch():
    """Integer and bool operands, 0-d arrays and Python numbers: torch's result dtype, and its values
    (every operand read in the compute type, as torch's CUDA kernels read it)."""
    ints = torch.randint(-3000, 3000, (3, 4), device="cuda")
    cases = [
        ("add", torch.add, [randn(3, 4, dtype=torch.float16), ints]),
        ("mul", torch.mul, [randn(3, 4, dtype=torch.bfloat16), ints > 0]),
        ("sub", torch.sub, [ints.to(torch.int16), randn(4, dtype=torch.float32)]),
        ("add", torch.add, [ints, 2.5]),
        ("add", torch.add, [ints, torch.tensor(0.5, device="cuda", dtype=torch.float64)]),
        ("add", torch.add, [randn(3, 4, dtype=torch.float16), torch.tensor(0.1, device="cuda")]),
        ("mul", torch.mul, [randn(3, 4, dtype=torch.float16), True]),
        ("div", torch.div, [ints, ints.abs() + 1]),
        ("exp", torch.exp, [ints.to(torch.int32) % 50]),
        ("sigmoid", torch.sigmoid, [ints > 0]),
    ]
    for name, fn, inputs in cases:
        got = getattr(F, name)(*inputs)
        want = fn(*inputs)
        assert got.dtype == want.dtype, f"{name}: ampc gives {got.dtype}, torch {want.dtype}"
        close(got, want.double(), want.dtype, rtol=2 * RTOL[want.dtype], what=name)
    with pytest.raises(TypeError, match="add: input must be a floating array"):
        F.add(ints, ints)


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_dense_elementwise_in_any_memory_order(dtype):
    """The dense kernel (16-byte packs, a tail of 945 % 8 elements, one element a thread where a
    pointer is not 16-byte aligned) and the output in a channels-last input's layout."""
    cl = torch.channels_last
    x, y, g = (randn(3, 5, 7, 9, dtype=dtype).to(memory_format=cl) for _ in range(3))
    for got, fn, inputs in [(F.add(x, y), torch.add, [x, y]), (F.mul(x, 2.5), lambda a: a * 2.5, [x]),
                            (F.relu(x), torch.relu, [x]), (F.relu_backward(g, x), lambda a, b: a * (b > 0), [g, x]),
                            (F.gelu(x), TF.gelu, [x])]:
        assert got.is_contiguous(memory_format=cl)
        against(got, fn, inputs, dtype, what="channels-last")
    a, b = randn(1001, dtype=dtype)[1:], randn(1001, dtype=dtype)[1:]  # 2-, 4- or 8-byte aligned only
    against(F.sub(a, b), torch.sub, [a, b], dtype, what="misaligned")
    c = randn(1000, dtype=dtype)
    against(F.add(a, c, alpha=0.5), lambda p, q: torch.add(p, q, alpha=0.5), [a, c], dtype,
            what="misaligned with aligned")


# --------------------------------------------------------------------------------------------
# softmax, log_softmax
# --------------------------------------------------------------------------------------------

# Rows held in registers, a warp's (768, 1000) or 4 warps' or a block's (1536, 3000, 6144: packs.cuh's
# tiers), a block's in shared memory (the forward's 20001, and 50257 in 16 bits), streamed (7, 2049,
# 70001; 50257 in float32; rows off 16-byte boundaries too), strided (dim not last).
SOFTMAX_CASES = [((7,), 0), ((33, 1000), -1), ((5, 768), -1), ((4, 1536), -1), ((3, 3000), -1), ((3, 6144), -1),
                 ((3, 20001), -1), ((4, 50257), -1), ((2, 70001), -1), ((2, 3, 2049), -1), ((8, 16, 33), 1),
                 ((5, 1), 1), ((64, 3), 0)]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape,dim", SOFTMAX_CASES, ids=str)
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_softmax(shape, dim, log, dtype):
    x = randn(*shape, dtype=dtype, scale=3.0)
    op, top = (F.log_softmax, TF.log_softmax) if log else (F.softmax, TF.softmax)
    y = op(x, dim=dim)
    against(y, lambda v: top(v, dim=dim), [x], dtype, what="forward")
    g = randn(*shape, dtype=dtype)
    (want,) = autograd(lambda v: top(v, dim=dim), [x], g)
    bwd = F.log_softmax_backward if log else F.softmax_backward
    got = bwd(g, y, dim)
    # y is rounded to dtype before the backward reads it: softmax's p (g - sum g p) moves by the
    # rounding of p times |g| + 2 sum |g p|, log_softmax's g - exp(y) sum g by that of exp(y) times
    # (1 + |y|) sum |g|, wherever the difference cancels
    p, ga = TF.softmax(x.double(), dim=dim), g.double().abs()
    moved = (p * (1 + p.log().abs()) * ga.sum(dim, keepdim=True) if log
             else p * (ga + 2 * (ga * p).sum(dim, keepdim=True)))
    close(got, want, dtype, rtol=4 * RTOL[dtype], scale=moved + want.abs().max().item(), what="backward")
    if dtype in LOW:
        up = op(x, dim=dim, dtype=torch.float32)
        close(up, top(x.double(), dim=dim), torch.float32, what="dtype=float32")


@pytest.mark.parametrize("n", [2000, 20001, 70001], ids=["registers", "shared", "streamed"])
def test_softmax_special_values(n):
    x = randn(3, n)
    x[0] = -math.inf
    x[1, 17] = math.nan
    x[2, :n - 10] = -math.inf
    for op, top in ((F.softmax, TF.softmax), (F.log_softmax, TF.log_softmax)):
        got, want = op(x, dim=1), top(x, dim=1)
        assert torch.equal(got.isnan(), want.isnan())
        close(got[2], want[2], torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=ID.get)
def test_special_values_as_torch(dtype):
    """At infinities, signed zeros and NaN: relu's gradient passes at NaN, abs's is 0 there, x ** p
    by torch's special cases (sqrt, x * x * x, reciprocals) forward and backward, bit for bit against
    torch's CUDA kernels and autograd."""
    x = torch.tensor([-math.inf, math.inf, -0.0, 0.0, math.nan, -8.0, 1e-30, 3.0], device="cuda", dtype=dtype)
    x = torch.cat([x, randn(40, dtype=dtype, scale=3.0)])
    g = torch.linspace(0.5, 2.0, x.numel(), device="cuda", dtype=dtype)

    def same_bits(got, want, what):
        assert got.dtype == want.dtype, what
        ints = torch.int32 if dtype == torch.float32 else torch.int64
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), what
        assert torch.equal(got[~nan].view(ints), want[~nan].view(ints)), what

    def torch_grad(fn):
        t = x.clone().requires_grad_(True)
        fn(t).backward(g)
        return t.grad

    same_bits(F.relu_backward(g, x), torch_grad(TF.relu), "relu_backward")
    same_bits(F.abs_backward(g, x), torch_grad(torch.abs), "abs_backward")

    def near_bits(got, want, what):  # the same special values, finite ones within 4 eps
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), what
        assert torch.equal(got[got.isinf()], want[want.isinf()]), what
        finite = want.isfinite()
        close(got[finite], want[finite], dtype, rtol=4 * torch.finfo(dtype).eps, what=what)

    for p in (0.0, 1.0, 2.0, 3.0, -2.0, 0.5, -0.5, -1.0, 1.5):
        # x ** -0.5 (and 0.5's gradient, through it): torch's CUDA rsqrt is the hardware's (within
        # 2 ulp), ampc's 1 / sqrt rounded twice
        check = near_bits if p == -0.5 else same_bits
        check(F.pow(x, p), torch.pow(x, p), f"pow {p}")
        check = near_bits if p in (0.5, -0.5) else same_bits
        check(F.pow_backward(g, x, p), torch_grad(lambda t: torch.pow(t, p)), f"pow_backward {p}")


# --------------------------------------------------------------------------------------------
# layer_norm
# --------------------------------------------------------------------------------------------

# Rows of 768 to 20000 reach each of packs.cuh's cached tiers in float32 and in 16 bits; 20000 float32
# streams, 4099 takes the general kernels.
LN_CASES = [((4, 7), (7,)), ((2, 3, 17), (3, 17)), ((5, 1), (1,)), ((8, 768), (768,)), ((3, 4099), (4099,)),
            ((1000, 64), (64,)), ((4, 1536), (1536,)), ((6, 3072), (3072,)), ((3, 6144), (6144,)),
            ((2, 20000), (20000,))]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape,nshape", LN_CASES, ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(shape, nshape, affine, dtype):
    x = randn(*shape, dtype=dtype, scale=2.0) + 1.5
    x = x.to(dtype)
    w = randn(*nshape, dtype=dtype) if affine else None
    b = randn(*nshape, dtype=dtype) if affine else None
    fn = lambda v, wt, bs: TF.layer_norm(v, nshape, wt, bs)  # noqa: E731
    against(F.layer_norm(x, nshape, w, b), fn, [x, w, b], dtype, rtol=2 * RTOL[dtype], what="forward")
    g = randn(*shape, dtype=dtype)
    want = autograd(fn, [x, w, b], g)
    gi, gw, gb = F.layer_norm_backward(g, x, nshape, w, b)
    rows = x.numel() // math.prod(nshape)
    close(gi, want[0], dtype, rtol=4 * RTOL[dtype], what="grad input")
    if affine:
        # summed over rows: the terms' magnitude sets the scale
        close(gw, want[1], dtype, rtol=4 * RTOL[dtype], scale=(g.double().abs() * 3).reshape(rows, -1).sum(0).reshape(nshape),
              what="grad weight")
        close(gb, want[2], dtype, rtol=4 * RTOL[dtype], scale=g.double().abs().reshape(rows, -1).sum(0).reshape(nshape),
              what="grad bias")
    else:
        assert gw is None and gb is None


def test_layer_norm_backward_is_deterministic():
    x, g = randn(4096, 768), randn(4096, 768)
    w, b = randn(768), randn(768)
    first = F.layer_norm_backward(g, x, (768,), w, b)
    for _ in range(3):
        again = F.layer_norm_backward(g, x, (768,), w, b)
        for u, v in zip(first, again):
            assert torch.equal(u.view(torch.int32), v.view(torch.int32))


# --------------------------------------------------------------------------------------------
# Losses
# --------------------------------------------------------------------------------------------

CE_CASES = [
    dict(shape=(64, 1000)),
    dict(shape=(64, 1000), reduction="sum"),
    dict(shape=(64, 1000), reduction="none"),
    dict(shape=(16, 50257)),
    dict(shape=(33, 10), weight=True),
    dict(shape=(33, 10), ignore_index=3),
    dict(shape=(33, 10), label_smoothing=0.1),
    dict(shape=(33, 10), label_smoothing=0.2, weight=True, ignore_index=1),
    dict(shape=(4, 10, 5, 6)),
    dict(shape=(4, 10, 5, 6), reduction="none", weight=True),
    dict(shape=(10,)),
    dict(shape=(33, 10), probs=True),
    dict(shape=(33, 10), probs=True, label_smoothing=0.1, weight=True),
    dict(shape=(4, 10, 7), probs=True, reduction="sum"),
]


def _ce_inputs(case, dtype):
    shape = case["shape"]
    x = randn(*shape, dtype=dtype, scale=2.0)
    classes = shape[1] if len(shape) > 1 else shape[0]
    if case.get("probs"):
        target = torch.softmax(randn(*shape, dtype=torch.float64), dim=1 if len(shape) > 1 else 0).to(dtype)
    else:
        tshape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
        target = torch.randint(0, classes, tshape, device="cuda")
    kwargs = dict(reduction=case.get("reduction", "mean"), label_smoothing=case.get("label_smoothing", 0.0))
    if "ignore_index" in case:
        kwargs["ignore_index"] = case["ignore_index"]
    weight = torch.rand(classes, device="cuda", dtype=torch.float64).to(dtype) + 0.5 if case.get("weight") else None
    return x, target, weight, kwargs


def test_cross_entropy_with_strided_byte_targets():
    """1-byte class indices in a strided view are copied dense by the cast kernel's element path
    (they were refused on the GPU)."""
    x = randn(6, 5)
    t = torch.randint(0, 5, (6, 2), device="cuda", dtype=torch.uint8)[:, 1]
    against(F.cross_entropy(x, t), lambda v, u: TF.cross_entropy(v, u.long()), [x, t], torch.float32)


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("case", CE_CASES, ids=str)
def test_cross_entropy(case, dtype):
    x, target, weight, kwargs = _ce_inputs(case, dtype)
    fn = lambda v, t, w: TF.cross_entropy(v, t, w, **kwargs)  # noqa: E731
    loss = F.cross_entropy(x, target, weight, **kwargs)
    # the float64 reference on the rounded inputs; torch itself in dtype
    against(loss, fn, [x, target, weight], dtype, rtol=4 * RTOL[dtype], what="forward")
    g = randn(*loss.shape, dtype=dtype)
    want = autograd(fn, [x, target, weight], g, wrt=(0,))[0]
    got = F.cross_entropy_backward(g, x, target, weight, **kwargs)
    close(got, want, dtype, rtol=4 * RTOL[dtype], what="backward")


def test_nll_loss():
    for dtype in FLOATS:
        x = TF.log_softmax(randn(33, 10), dim=1).to(dtype)
        t = torch.randint(0, 10, (33,), device="cuda")
        w = torch.rand(10, device="cuda").to(dtype) + 0.5
        for kwargs in (dict(), dict(weight=w), dict(reduction="sum", ignore_index=2), dict(reduction="none")):
            loss = F.nll_loss(x, t, **kwargs)
            fn = lambda v, wt: TF.nll_loss(v, t, wt, **{k: a for k, a in kwargs.items() if k != "weight"})  # noqa
            against(loss, fn, [x, kwargs.get("weight")], dtype, rtol=4 * RTOL[dtype], what=str(kwargs))
            g = randn(*loss.shape, dtype=dtype)
            want = autograd(fn, [x, kwargs.get("weight")], g, wrt=(0,))[0]
            close(F.nll_loss_backward(g, x, t, **kwargs), want, dtype, rtol=4 * RTOL[dtype], what=str(kwargs))


def test_cross_entropy_class_index_out_of_range_is_nan_on_the_gpu():
    """No host synchronisation inside an op: a bad index cannot raise; its loss is NaN, its gradient 0."""
    x, t = randn(4, 10), torch.tensor([1, 10, -3, 2], device="cuda")
    assert math.isnan(F.cross_entropy(x, t).item())
    per = F.cross_entropy(x, t, reduction="none")
    assert per.isnan().tolist() == [False, True, True, False]
    g = F.cross_entropy_backward(torch.ones(4, device="cuda"), x, t, reduction="none")
    assert torch.equal(g[1:3], torch.zeros(2, 10, device="cuda")) and g[0].abs().sum() > 0


POINTWISE = [
    ("mse_loss", F.mse_loss, F.mse_loss_backward, TF.mse_loss),
    ("l1_loss", F.l1_loss, F.l1_loss_backward, TF.l1_loss),
    ("bce_with_logits", F.binary_cross_entropy_with_logits, F.binary_cross_entropy_with_logits_backward,
     TF.binary_cross_entropy_with_logits),
    ("bce", F.binary_cross_entropy, F.binary_cross_entropy_backward, TF.binary_cross_entropy),
]


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name,fwd,bwd,top", POINTWISE, ids=[p[0] for p in POINTWISE])
def test_pointwise_loss(name, fwd, bwd, top, reduction, dtype):
    x, y = randn(37, 29, dtype=dtype), randn(37, 29, dtype=dtype)
    if name.startswith("bce"):
        y = torch.rand(37, 29, device="cuda").to(dtype)
    if name == "bce":
        x = torch.sigmoid(x.double()).to(dtype)
    fn = lambda v, t: top(v, t, reduction=reduction)  # noqa: E731
    loss = fwd(x, y, reduction=reduction)
    scale = None if reduction == "none" else fn(x.double().abs(), y.double().abs()).abs().item() + 1
    against(loss, fn, [x, y], dtype, rtol=4 * RTOL[dtype], scale=scale, what="forward")
    g = randn(*loss.shape, dtype=dtype)
    want = autograd(fn, [x, y], g)[0]
    close(bwd(g, x, y, reduction=reduction), want, dtype, rtol=4 * RTOL[dtype], what="backward")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bce_with_logits_pos_weight(reduction, dtype):
    x, y = randn(37, 29, dtype=dtype), torch.rand(37, 29, device="cuda").to(dtype)
    p, w = (torch.rand(29, device="cuda") * 3).to(dtype), (torch.rand(29, device="cuda") + 0.5).to(dtype)
    fn = lambda v, t: TF.binary_cross_entropy_with_logits(v, t, w, reduction=reduction, pos_weight=p)  # noqa: E731
    loss = F.binary_cross_entropy_with_logits(x, y, w, reduction=reduction, pos_weight=p)
    scale = None if reduction == "none" else loss.double().abs().item() + 1
    against(loss, fn, [x, y], dtype, rtol=4 * RTOL[dtype], scale=scale, what="forward")
    g = randn(*loss.shape, dtype=dtype)
    want = autograd(lambda v, t: TF.binary_cross_entropy_with_logits(v, t, w.double(), reduction=reduction,
                                                                      pos_weight=p.double()), [x, y], g, wrt=(0,))[0]
    got = F.binary_cross_entropy_with_logits_backward(g, x, y, w, reduction, pos_weight=p)
    close(got, want, dtype, rtol=4 * RTOL[dtype], what="backward")


# --------------------------------------------------------------------------------------------
# Reductions
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape,dim", [((3, 5, 7), None), ((3, 5, 7), 1), ((3, 5, 7), (0, 2)), ((3, 5, 7), 0),
                                       ((1 << 22,), None), ((4096, 3), 0), ((3, 70_000), 1), ((70_000, 40), 0),
                                       ((2, 3000, 33), 1), ((513, 2304), 0)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_sum_and_mean(shape, dim, keepdim, dtype):
    x = randn(*shape, dtype=dtype)
    kw = {} if dim is None else dict(dim=dim, keepdim=keepdim)
    mag = torch.sum(x.double().abs(), **kw)
    against(F.sum(x, **kw), lambda v: torch.sum(v, **kw), [x], dtype, scale=mag, what="sum")
    count = x.numel() // mag.numel()
    against(F.mean(x, **kw), lambda v: torch.mean(v, **kw), [x], dtype, scale=mag / count, what="mean")
    g = randn(*mag.shape, dtype=dtype)
    close(F.sum_backward(g, tuple(shape), dim, keepdim), autograd(lambda v: torch.sum(v, **kw), [x], g)[0], dtype,
          what="sum backward")


def test_sum_is_deterministic():
    x = randn(1 << 24)
    first = F.sum(x)
    for _ in range(3):
        assert torch.equal(F.sum(x).view(torch.int32), first.view(torch.int32))


# --------------------------------------------------------------------------------------------
# Matrix products (cuBLASLt)
# --------------------------------------------------------------------------------------------

def mm_scale(a, b):
    return torch.matmul(a.double().abs(), b.double().abs())


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("xshape,features", [((5, 7), 4), ((2, 3, 64), 128), ((1, 7), 4), ((7,), 4),
                                             ((256, 768), 3072), ((33, 17), 1),
                                             ((256, 1024), 4099)], ids=str)  # 16-bit rows off 16 bytes
@pytest.mark.parametrize("bias", [True, False])
def test_linear(xshape, features, bias, dtype):
    x = randn(*xshape, dtype=dtype)
    w = randn(features, xshape[-1], dtype=dtype)
    b = randn(features, dtype=dtype) if bias else None
    scale = mm_scale(x, w.t()) + (b.double().abs() if bias else 0)
    against(F.linear(x, w, b), TF.linear, [x, w, b], dtype, scale=scale, what="linear")
    against(F.linear(strided(x), w, b), TF.linear, [strided(x), w, b], dtype, scale=scale, what="strided")
    g = randn(*(xshape[:-1] + (features,)), dtype=dtype)
    want = autograd(TF.linear, [x, w, b], g)
    gi, gw, gb = F.linear_backward(g, x, w, bias_grad=bias)
    close(gi, want[0], dtype, scale=mm_scale(g, w), what="grad input")
    g2, x2 = g.reshape(-1, features), x.reshape(-1, xshape[-1])
    close(gw, want[1], dtype, scale=mm_scale(g2.t(), x2), what="grad weight")
    if bias:
        close(gb, want[2], dtype, scale=g2.double().abs().sum(0), what="grad bias")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("xshape,bshape", [((5, 7), (1, 4)), ((5, 7), (5, 4)), ((2, 3, 7), (3, 1)), ((5, 7), ())],
                         ids=str)
def test_linear_takes_a_bias_that_broadcasts(xshape, bshape, dtype):
    """A bias broadcast to the output (torch's autocast list passes a square one): copied into the
    output, which cuBLASLt reads as C; its gradient summed down to its shape."""
    x, w, b = randn(*xshape, dtype=dtype), randn(4, 7, dtype=dtype), randn(*bshape, dtype=dtype)
    # torch's linear flattens a 3-D input first and takes only a bias that broadcasts to that 2-D
    # product; ampc's takes any bias that broadcasts to the output: x @ w.T + b is the reference
    reference = TF.linear if len(xshape) == 2 else (lambda x, w, b: torch.matmul(x, w.t()) + b)
    scale = mm_scale(x, w.t()) + b.double().abs()
    against(F.linear(x, w, b), reference, [x, w, b], dtype, scale=scale, what="linear, broadcast bias")
    g = randn(*(xshape[:-1] + (4,)), dtype=dtype)
    want = autograd(reference, [x, w, b], g)[2]
    gb = F.linear_backward(g, x, w, bias_shape=bshape)[2]
    assert tuple(gb.shape) == bshape
    close(gb, want, dtype, scale=g.double().abs().sum(), what="grad of a broadcast bias")


@pytest.mark.never_waits
def test_untuned_products_never_wait(monkeypatch):
    """AMPC_GEMM_TUNING=0: a shape's first product takes cuBLASLt's heuristic first and only enqueues;
    by default that first call times the heuristic's candidates, and so waits for the GPU. Shapes no
    other test takes, so that each call makes its plan; a product of 8 rows fewer first, so that the
    kernels it takes are loaded (lazy loading may wait for the GPU when it loads one)."""
    def first_product_waited(m, k, n, tuning):
        monkeypatch.setenv("AMPC_GEMM_TUNING", tuning)
        a, b = randn(m, k, dtype=torch.float16), randn(k, n, dtype=torch.float16)
        F.matmul(a[8:], b)
        torch.cuda.synchronize()
        torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU work
        start = torch.cuda.Event()
        start.record()
        out = F.matmul(a, b)
        waited = start.query()
        against(out, torch.matmul, [a, b], torch.float16, scale=mm_scale(a, b), what=f"tuning {tuning}")
        return waited

    assert not first_product_waited(200, 328, 176, "0")
    assert first_product_waited(216, 344, 184, "1")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_matmul_of_heads_viewed_out_of_a_sequence(dtype):
    """(batch, heads) matrices viewed out of (batch, sequence, heads, features) arrays step by two
    strides: cuBLASLt's batch takes the heads, once per batch index, with nothing copied."""
    q, k = (randn(2, 7, 3, 8, dtype=dtype).transpose(1, 2) for _ in range(2))
    kt = k.transpose(-1, -2)
    shared = randn(3, 8, 5, dtype=dtype)
    for a, b in [(q, kt), (q, shared), (q.transpose(-1, -2), q)]:
        assert not a.is_contiguous()
        against(F.matmul(a, b), torch.matmul, [a, b], dtype, scale=mm_scale(a, b), what=f"{tuple(b.shape)}")
    out = F.scaled_dot_product_attention(q, k, q, is_causal=True)
    want = TF.scaled_dot_product_attention(q.double(), k.double(), q.double(), is_causal=True)
    close(out, want, dtype, rtol=4 * RTOL[dtype], what="attention")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("ashape,bshape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                           ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)), ((3, 4), (4,)),
                                           ((4,), (4,)), ((2, 3, 4), (4,)), ((1, 3, 4), (2, 4, 5))], ids=str)
def test_matmul(ashape, bshape, dtype):
    a, b = randn(*ashape, dtype=dtype), randn(*bshape, dtype=dtype)
    against(F.matmul(a, b), torch.matmul, [a, b], dtype, scale=mm_scale(a, b), what="matmul")
    g = randn(*torch.matmul(a, b).shape, dtype=dtype)
    want = autograd(torch.matmul, [a, b], g)
    ga, gb = F.matmul_backward(g, a, b)
    close(ga, want[0], dtype, rtol=8 * RTOL[dtype], scale=want[0].abs().max().item() + 8, what="grad a")
    close(gb, want[1], dtype, rtol=8 * RTOL[dtype], scale=want[1].abs().max().item() + 8, what="grad b")


def test_mm_bmm_addmm_baddbmm():
    for dtype in FLOATS:
        a, b = randn(3, 4, dtype=dtype), randn(4, 5, dtype=dtype)
        against(F.mm(a, b), torch.mm, [a, b], dtype, scale=mm_scale(a, b), what="mm")
        bt = b.t().contiguous().t()  # transposed storage
        against(F.mm(a.t().contiguous().t(), bt), torch.mm, [a, b], dtype, scale=mm_scale(a, b), what="mm T")
        c = randn(5, dtype=dtype)
        fn = lambda c_, a_, b_: torch.addmm(c_, a_, b_, beta=0.5, alpha=2)  # noqa: E731
        against(F.addmm(c, a, b, beta=0.5, alpha=2), fn, [c, a, b], dtype,
                scale=2 * mm_scale(a, b) + c.double().abs(), what="addmm")
        against(F.addmm(c, a, b), torch.addmm, [c, a, b], dtype, scale=mm_scale(a, b) + c.double().abs(),
                what="addmm bias")
        nan = torch.full((3, 5), float("nan"), device="cuda", dtype=dtype)  # beta 0 reads nothing of input
        against(F.addmm(nan, a, b, beta=0), lambda c_, a_, b_: torch.addmm(c_, a_, b_, beta=0), [nan, a, b], dtype,
                scale=mm_scale(a, b), what="addmm beta 0")
        c2 = randn(3, 5, dtype=dtype)
        against(F.addmm(c2, a, b, beta=-1), lambda c_, a_, b_: torch.addmm(c_, a_, b_, beta=-1), [c2, a, b], dtype,
                scale=mm_scale(a, b) + c2.double().abs(), what="addmm matrix")
        x, y, z = randn(2, 3, 4, dtype=dtype), randn(2, 4, 6, dtype=dtype), randn(2, 3, 6, dtype=dtype)
        against(F.bmm(x, y), torch.bmm, [x, y], dtype, scale=mm_scale(x, y), what="bmm")
        against(F.baddbmm(z, x, y, beta=-1), lambda z_, x_, y_: torch.baddbmm(z_, x_, y_, beta=-1), [z, x, y], dtype,
                scale=mm_scale(x, y) + z.double().abs(), what="baddbmm")


def test_low_precision_products_round_once():
    """float16/bfloat16 in and out: the float32 sum rounded once (cuBLASLt's 32F compute)."""
    for dtype in LOW:
        a, b = randn(64, 4096, dtype=dtype), randn(4096, 64, dtype=dtype)
        exact = (a.double() @ b.double())
        got = F.mm(a, b)
        # float32 sums of 4096 terms of about 1 are off by about 1e-4; float16 partial sums by about 1
        close(got, exact, dtype, scale=4.0)


# --------------------------------------------------------------------------------------------
# Autocast: the dtype torch's autocast gives each op on CUDA
# --------------------------------------------------------------------------------------------

AUTOCAST = [
    ("linear", lambda m, x, w: m.linear(x, w)),
    ("matmul", lambda m, x, w: m.matmul(x, w.t())),
    ("softmax", lambda m, x, w: m.softmax(x, dim=-1)),
    ("log_softmax", lambda m, x, w: m.log_softmax(x, dim=-1)),
    ("layer_norm", lambda m, x, w: m.layer_norm(x, (8,))),
    ("mse_loss", lambda m, x, w: m.mse_loss(x, x)),
    ("relu", lambda m, x, w: m.relu(x)),
    ("gelu", lambda m, x, w: m.gelu(x)),
    ("softplus", lambda m, x, w: m.softplus(x)),
    ("mish", lambda m, x, w: m.mish(x)),
]


@pytest.mark.parametrize("region", LOW, ids=ID.get)
@pytest.mark.parametrize("name,call", AUTOCAST, ids=[a[0] for a in AUTOCAST])
def test_autocast_dtypes_match_torch(name, call, region):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x, w = randn(4, 8, dtype=dtype), randn(8, 8, dtype=dtype)
        with torch.autocast("cuda", dtype=region):
            want = call(TF if name not in ("matmul",) else torch, x, w)
        with ampc.autocast("cuda", dtype=region):
            got = call(F, x, w)
        assert got.dtype == want.dtype, (name, dtype)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

def test_bad_input_on_the_gpu():
    x = randn(3, 4)
    with pytest.raises(TypeError, match="floating"):
        F.mm(torch.ones(3, 4, dtype=torch.int64, device="cuda"), torch.ones(4, 2, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="device"):
        F.mm(x, torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"mat1 and mat2 shapes cannot be multiplied \(3x4 and 5x6\)"):
        F.mm(x, randn(5, 6))
    with pytest.raises(TypeError, match=r"class indices must be an integer array, and class probabilities need "
                                        r"input's shape \(3, 4\)"):
        F.cross_entropy(x, torch.zeros(3, device="cuda"))  # float labels of the indices' shape
    with pytest.raises(ValueError, match="device"):
        F.layer_norm(x, (4,), torch.ones(4))
    before = x.clone()
    with pytest.raises(IndexError, match="Dimension out of range"):
        F.softmax(x, dim=2)  # torch's error and text
    assert torch.equal(x, before)


def test_ops_on_a_side_stream_wait_for_their_inputs():
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = randn(2048, 2048)
        torch.cuda._sleep(10_000_000)
        x.mul_(2)  # queued behind the sleep: the op must see it
        y = F.softmax(x, dim=-1)
    torch.cuda.synchronize()
    close(y, TF.softmax(x.double(), dim=-1), torch.float32)
