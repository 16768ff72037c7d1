"""ampc.nn.functional against torch.nn.functional on the CPU, where torch is installed (the GPU
machine; skipped elsewhere): the same output dtype and shape, values within the dtype's rounding,
the same refusals, and every gradient through ampc's tape against torch's autograd in float64.
The cases are the argument combinations that found defects when this comparison was first run
(type promotion, dtype=, fully masked attention rows, beta=0, learned masks, soft targets)."""

import numpy as np
import pytest

import ampc

torch = pytest.importorskip("torch")
TF = torch.nn.functional
F = ampc.nn.functional

RTOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-10}


def _rng():
    return np.random.default_rng(20261205)


def _torch(x):
    return torch.from_numpy(np.array(x)) if isinstance(x, np.ndarray) else x  # a 0-d array stays 0-d


def _same(name, got, want):
    got = _torch(np.asarray(got)) if not isinstance(got, torch.Tensor) else got
    assert got.dtype == want.dtype, f"{name}: ampc {got.dtype}, torch {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{name}: ampc {tuple(got.shape)}, torch {tuple(want.shape)}"
    if want.dtype in RTOL:
        w, g = want.double(), got.double()
        scale = w[w.isfinite()].abs().max().item() if w.isfinite().any() else 1.0
        ok = ((g - w).abs() <= RTOL[want.dtype] * (w.abs() + scale)) | (w.isnan() & g.isnan()) | (g == w)
        assert bool(ok.all()), f"{name}: {int((~ok).sum())} of {ok.numel()} values off"
    else:
        assert torch.equal(got, want), name


def _forward_cases(r):
    x, h = r.standard_normal((4, 5)).astype(np.float32), r.standard_normal((4, 5)).astype(np.float16)
    ints, q = np.arange(20).reshape(4, 5), r.standard_normal((2, 3, 5, 8)).astype(np.float32)
    mask = r.random((5, 5)) > 0.3
    mask[2] = False  # a query that attends to nothing
    x4 = r.standard_normal((2, 3, 7, 6)).astype(np.float32)
    return [
        ("add f16 + 0-d f32", F.add, torch.add, (h, np.array(1.5, np.float32))),
        ("add f32 + int64", F.add, torch.add, (x, ints)),
        ("mul f16 * bool", F.mul, torch.mul, (h, ints > 7)),
        ("add int64 + 2.5", F.add, torch.add, (ints, 2.5)),
        ("exp int64", F.exp, torch.exp, (ints,)),
        ("div int / int", F.div, torch.div, (ints, ints + 1)),
        ("pow int ** 2.5", F.pow, torch.pow, (ints, 2.5)),
        ("cat f32 int32", lambda a, b: F.cat([a, b]), lambda a, b: torch.cat([a, b]), (x, ints.astype(np.int32))),
        ("sum dtype f64", lambda a: F.sum(a, 1, dtype=np.float64), lambda a: torch.sum(a, 1, dtype=torch.float64),
         (r.standard_normal((3, 30000)).astype(np.float32) * 100,)),
        ("sum over ()", lambda a: F.sum(a, ()), lambda a: torch.sum(a, ()), (x,)),
        ("softmax dtype f64", lambda a: F.softmax(a, 1, dtype=np.float64),
         lambda a: TF.softmax(a, 1, dtype=torch.float64), (x,)),
        ("squeeze tuple", lambda a: F.squeeze(a, (1, 3)), lambda a: torch.squeeze(a, (1, 3)),
         (x.reshape(4, 1, 5, 1),)),
        ("sdpa dead row, bool mask", lambda a, m: F.scaled_dot_product_attention(a, a, a, attn_mask=m),
         lambda a, m: TF.scaled_dot_product_attention(a, a, a, attn_mask=m), (q, mask)),
        ("addmm beta 0 NaN input", lambda c, a, b: F.addmm(c, a, b, beta=0),
         lambda c, a, b: torch.addmm(c, a, b, beta=0), (np.full((4, 4), np.nan, np.float32), x, x.T.copy())),
        ("bce logits pos_weight", lambda a, t, p: F.binary_cross_entropy_with_logits(a, t, pos_weight=p),
         lambda a, t, p: TF.binary_cross_entropy_with_logits(a, t, pos_weight=p),
         (x, r.random((4, 5)).astype(np.float32), (r.random(5) * 3).astype(np.float32))),
        ("group_norm empty batch", lambda a: F.group_norm(a, 3), lambda a: TF.group_norm(a, 3),
         (np.zeros((0, 3, 4), np.float32),)),
        ("conv2d same dilated", lambda a, w: F.conv2d(a, w, padding="same", dilation=2),
         lambda a, w: TF.conv2d(a, w, padding="same", dilation=2),
         (x4, r.standard_normal((4, 3, 3, 2)).astype(np.float32))),
        ("avg_pool ceil no pad count", lambda a: F.avg_pool2d(a, 3, 2, 1, True, False),
         lambda a: TF.avg_pool2d(a, 3, 2, 1, True, False), (x4,)),
        ("cross_entropy probs smoothing", lambda a, t: F.cross_entropy(a, t, label_smoothing=0.2),
         lambda a, t: TF.cross_entropy(a, t, label_smoothing=0.2),
         (x, (lambda p: p / p.sum(1, keepdims=True))(r.random((4, 5)).astype(np.float32)))),
    ]


@pytest.mark.parametrize("case", range(len(_forward_cases(_rng()))))
def test_forward_as_torch(case):
    name, ours, theirs, args = _forward_cases(_rng())[case]
    _same(name, ours(*args), theirs(*[_torch(a) for a in args]))


def _grad_cases(r):
    def f64(*shape):
        return r.standard_normal(shape)

    soft = r.random((6, 5))
    soft /= soft.sum(1, keepdims=True)
    t = r.integers(0, 5, 6)
    return [  # name, ampc fn, torch fn, inputs, indices of the inputs that get gradients
        ("sdpa learned float mask", lambda a, m: F.scaled_dot_product_attention(a, a, a, attn_mask=m),
         lambda a, m: TF.scaled_dot_product_attention(a, a, a, attn_mask=m), [f64(2, 3, 5, 4), f64(3, 5, 5)], (0, 1)),
        ("cross_entropy soft targets", lambda a, p: F.cross_entropy(a, p, label_smoothing=0.3),
         lambda a, p: TF.cross_entropy(a, p, label_smoothing=0.3), [f64(6, 5), soft], (0, 1)),
        ("bce targets", F.binary_cross_entropy, TF.binary_cross_entropy, [r.random((6, 5)) * 0.8 + 0.1, soft], (0, 1)),
        ("bce logits targets, pos_weight",
         lambda a, b: F.binary_cross_entropy_with_logits(a, b, pos_weight=np.arange(5.0)),
         lambda a, b: TF.binary_cross_entropy_with_logits(a, b, pos_weight=torch.arange(5.0, dtype=torch.float64)),
         [f64(6, 5), soft], (0, 1)),
        ("embedding scale_grad_by_freq", lambda w: F.embedding(np.array([1, 1, 3]), w, scale_grad_by_freq=True),
         lambda w: TF.embedding(torch.tensor([1, 1, 3]), w, scale_grad_by_freq=True), [f64(5, 3)], (0,)),
        ("cross_entropy weighted ignore", lambda a: F.cross_entropy(a, t, np.arange(1.0, 6.0), ignore_index=2),
         lambda a: TF.cross_entropy(a, torch.from_numpy(t), torch.arange(1.0, 6.0, dtype=torch.float64),
                                    ignore_index=2), [f64(6, 5)], (0,)),
        ("group_norm affine", lambda a, w, b: F.group_norm(a, 3, w, b), lambda a, w, b: TF.group_norm(a, 3, w, b),
         [f64(2, 6, 4), f64(6), f64(6)], (0, 1, 2)),
        ("max_pool dilated ceil", lambda a: F.max_pool2d(a, 3, 2, 1, 2, True),
         lambda a: TF.max_pool2d(a, 3, 2, 1, 2, True), [f64(2, 3, 9, 8)], (0,)),
        ("pow array exponent, zeros", F.pow, torch.pow,
         [np.where(r.random((4, 5)) < 0.3, 0.0, r.random((4, 5)) + 0.1), np.where(r.random(5) < 0.4, 0.0, f64(5))],
         (0, 1)),
    ]


@pytest.mark.parametrize("case", range(len(_grad_cases(_rng()))))
def test_gradients_as_torch(case):
    name, ours, theirs, inputs, wrt = _grad_cases(_rng())[case]
    params = [ampc.nn.Parameter(x.copy()) if i in wrt else x for i, x in enumerate(inputs)]
    out = ours(*params)
    g = _rng().standard_normal(np.shape(out))
    F.sum(F.mul(out, g)).backward()
    leaves = [torch.tensor(x, requires_grad=i in wrt) for i, x in enumerate(inputs)]
    (theirs(*leaves) * torch.from_numpy(g)).sum().backward()
    for i in wrt:
        want = leaves[i].grad.numpy()
        np.testing.assert_allclose(params[i].grad, want, rtol=1e-9, atol=1e-12 * (1 + np.abs(want).max()),
                                   err_msg=f"{name}: input {i}")
