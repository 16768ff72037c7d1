"""The layer ops beyond the row kernels on the CPU: embedding, dropout (Philox), group_norm,
scaled_dot_product_attention (causal and masked), and the glue between layers; forward against
float64 references written from the definitions, backward against float64 finite differences,
the dtypes autocast gives them, bad input."""

import math

import numpy as np
import pytest

import ampc
from ampc.nn import _attention, _embedding
import ops_reference as ref
from ops_reference import BF16, F16, F32, F64, FLOATS, assert_close, f64, numeric_grad

F = ampc.nn.functional


@pytest.fixture
def rng(test_seed):
    return np.random.default_rng(test_seed)


# --------------------------------------------------------------------------------------------
# Philox: the generator dropout draws from
# --------------------------------------------------------------------------------------------

def philox(seed, counter):
    """Philox4x32-10 in Python, from the paper (Salmon et al. 2011)."""
    m = (1 << 32) - 1
    c = [counter & m, counter >> 32, 0, 0]
    k = [seed & m, seed >> 32]
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m, (p0 >> 32) ^ c[3] ^ k[1], p0 & m]
        k = [(k[0] + 0x9E3779B9) & m, (k[1] + 0xBB67AE85) & m]
    return c


def test_philox_known_answer():
    # Random123's known-answer vector for philox4x32-10, counter 0 and key 0
    assert philox(0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def dropout_mask(seed, offset, n, p):
    keep_below = round((1 - p) * 2**24)
    words = [w for b in range((n + 3) // 4) for w in philox(seed, offset + b)]
    return np.array([(w >> 8) < keep_below for w in words[:n]])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_dropout_is_the_philox_mask(rng, dtype):
    ampc.manual_seed(1234)
    x = ref.random(rng, (3, 37), dtype)
    p = 0.3
    y, state = _embedding.dropout_forward(x, p)
    assert state == (1234, 0)
    keep = dropout_mask(1234, 0, x.size, p).reshape(x.shape)
    scale = np.float64(1 / (1 - p)) if dtype == F64 else np.float64(np.float32(1 / (1 - p)))
    # the product in the accumulation dtype, rounded once
    want = np.where(keep, (f64(x) * scale).astype(F32 if dtype != F64 else F64), 0)
    assert y.dtype == dtype and np.array_equal(f64(y), f64(np.asarray(want).astype(dtype)))
    # the stream moved on by ceil(111 / 4) counters; the next draw differs
    assert ampc.random.get_rng_state() == (1234, 28)
    y2, state2 = _embedding.dropout_forward(x, p)
    assert state2 == (1234, 28) and not np.array_equal(y2 != 0, y != 0)
    # backward: the same mask and scale
    g = ref.random(rng, x.shape, dtype)
    gx = F.dropout_backward(g, state, p)
    assert np.array_equal(f64(gx), f64(np.where(keep, (f64(g) * scale).astype(F32 if dtype != F64 else F64),
                                                0).astype(dtype)))


def test_dropout_statistics_and_edges(rng):
    x = np.ones(200_000, np.float32)
    y = F.dropout(x, 0.25)
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.01 and np.allclose(y[kept], 1 / 0.75)
    assert F.dropout(x, 0.5, training=False) is x
    assert np.array_equal(F.dropout(x, 0.0), x)
    assert not F.dropout(x, 1.0).any()
    bad = np.array([np.nan, np.inf], np.float32)
    out = F.dropout(bad, 1.0)
    assert np.isnan(out).all(), "a dropped NaN or inf must stay visible (x * 0), as torch's"
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)
    with pytest.raises(TypeError):
        F.dropout(np.arange(4), 0.5)
    ampc.manual_seed(7)
    a = F.dropout(x, 0.5)
    ampc.manual_seed(7)
    assert np.array_equal(a, F.dropout(x, 0.5))
    inplace = x.copy()
    assert F.dropout(inplace, 0.5, inplace=True) is inplace and (inplace == 0).any()


def test_dropout_thread_count_does_not_change_bits(rng):
    x = ref.random(rng, (300_001,), F16)
    old = ampc.get_num_threads()
    try:
        ampc.set_num_threads(1)
        one = _embedding.dropout_forward(x, 0.4)
        ampc.set_num_threads(2)
        two = ampc._C._dropout(x, 0.4, *one[1])
    finally:
        ampc.set_num_threads(old)
    assert np.array_equal(one[0].view(np.uint16), two.view(np.uint16))


# --------------------------------------------------------------------------------------------
# embedding
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32, np.uint8], ids=str)
def test_embedding(rng, dtype, index_dtype):
    w = ref.random(rng, (11, 7), dtype)
    idx = rng.integers(0, 11, (4, 5)).astype(index_dtype)
    y = F.embedding(idx, w)
    assert y.dtype == dtype and y.shape == (4, 5, 7)
    assert np.array_equal(y.view(np.uint8), w[idx].view(np.uint8))
    # strided indices and weight
    assert np.array_equal(f64(F.embedding(idx[:, ::2], w)), f64(w[idx[:, ::2]]))
    wide = np.repeat(w, 2, axis=1)[:, ::2]
    assert np.array_equal(f64(F.embedding(idx, wide)), f64(w[idx]))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_backward(rng, dtype, padding_idx):
    num, dim = 9, 300  # dim above the kernel's column block
    idx = rng.integers(0, num, (6, 7))
    idx[0, :3] = 2  # a repeated index
    dy = ref.random(rng, (6, 7, dim), dtype)
    gw = F.embedding_backward(dy, idx, num, padding_idx)
    want = np.zeros((num, dim))
    pad = None if padding_idx is None else padding_idx % num
    for p, r in enumerate(idx.reshape(-1)):
        if r != pad:
            want[r] += f64(dy).reshape(-1, dim)[p]
    assert gw.dtype == dtype
    assert_close(gw, want, dtype, scale=np.abs(f64(dy)).max() * 4, what="embedding grad")
    if pad is not None:
        assert not f64(gw[pad]).any()
    # against finite differences of the forward (float64)
    if dtype == F64:
        w = rng.standard_normal((num, dim))
        r = rng.standard_normal((6, 7, dim))
        num_g = numeric_grad(lambda v: F.embedding(idx, v), w.copy(), r)
        if pad is not None:
            num_g[pad] = 0
        np.testing.assert_allclose(F.embedding_backward(r, idx, num, padding_idx), num_g, atol=1e-6)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_embedding_scale_grad_by_freq(rng, dtype):
    """Each row's gradient divided by how often its index occurs in the batch, as torch; on the tape too."""
    idx = rng.integers(0, 6, (4, 5))
    idx[0, :3] = 2
    dy = ref.random(rng, (4, 5, 3), dtype)
    plain = F.embedding_backward(dy, idx, 6)
    counts = np.maximum(np.bincount(idx.reshape(-1), minlength=6), 1)[:, None]
    got = F.embedding_backward(dy, idx, 6, scale_grad_by_freq=True)
    assert got.dtype == dtype
    quotient = plain.astype(F32) / counts.astype(F32)  # in float32, rounded once to dtype: the kernel's
    np.testing.assert_array_equal(f64(got), f64(quotient.astype(dtype)))
    w = ampc.nn.Parameter(ref.random(rng, (6, 3), F64))
    F.sum(F.mul(F.embedding(idx, w, scale_grad_by_freq=True), f64(dy))).backward()
    np.testing.assert_allclose(w.grad, F.embedding_backward(f64(dy), idx, 6) / counts, rtol=1e-15)


def test_embedding_bad_input(rng):
    w = ref.random(rng, (5, 3), F32)
    with pytest.raises(ValueError, match="index 5, outside the 5 rows"):
        F.embedding(np.array([1, 5]), w)
    with pytest.raises(ValueError, match="index -1"):
        F.embedding(np.array([-1]), w)
    with pytest.raises(TypeError, match="integer"):
        F.embedding(np.array([1.0]), w)
    with pytest.raises(TypeError, match="floating"):
        F.embedding(np.array([1]), np.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="2-D"):
        F.embedding(np.array([1]), w.reshape(-1))
    with pytest.raises(ValueError, match="Padding_idx"):
        F.embedding(np.array([1]), w, padding_idx=5)
    with pytest.raises(ValueError, match="grad_output"):
        F.embedding_backward(np.ones((2, 3), np.float32), np.array([1, 2, 3]), 5)


# --------------------------------------------------------------------------------------------
# group_norm
# --------------------------------------------------------------------------------------------

def group_norm_ref(x, groups, w=None, b=None, eps=1e-5):
    x = f64(x)
    rows = x.reshape(x.shape[0], groups, -1)
    mu = rows.mean(-1, keepdims=True)
    var = rows.var(-1, keepdims=True)
    y = ((rows - mu) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (-1,) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * f64(w).reshape(shape)
    if b is not None:
        y = y + f64(b).reshape(shape)
    return y


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 3), 3), ((3, 4, 7), 2), ((1, 8, 1, 1), 8), ((2, 4), 1)],
                         ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm(rng, shape, groups, affine, dtype):
    x = ref.random(rng, shape, dtype, scale=2.0) + dtype.type(0.5)
    w = ref.random(rng, shape[1:2], dtype) if affine else None
    b = ref.random(rng, shape[1:2], dtype) if affine else None
    y = F.group_norm(x, groups, w, b)
    assert_close(y, group_norm_ref(x, groups, w, b), dtype, rtol=2 * ref.RTOL[dtype], what="group_norm")
    g = ref.random(rng, shape, dtype)
    gi, gw, gb = F.group_norm_backward(g, x, groups, w, b)
    # the analytic gradient in float64 against finite differences of the float64 reference
    x64, w64, b64, g64 = f64(x), (f64(w) if affine else None), (f64(b) if affine else None), f64(g)
    want_x = numeric_grad(lambda v: group_norm_ref(v, groups, w64, b64), x64.copy(), g64)
    tol = {F32: 2e-4, F16: 2e-2, BF16: 1e-1, F64: 1e-6}[dtype]
    np.testing.assert_allclose(f64(gi), want_x, atol=tol * (1 + np.abs(want_x).max()))
    if affine:
        want_w = numeric_grad(lambda v: group_norm_ref(x64, groups, v, b64), w64.copy(), g64)
        want_b = numeric_grad(lambda v: group_norm_ref(x64, groups, w64, v), b64.copy(), g64)
        np.testing.assert_allclose(f64(gw), want_w, atol=tol * (1 + np.abs(want_w).max()) * 4)
        np.testing.assert_allclose(f64(gb), want_b, atol=tol * (1 + np.abs(want_b).max()) * 4)
        assert gw.dtype == dtype and gb.dtype == dtype
    else:
        assert gw is None and gb is None


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("affine", ["weight and bias", "weight", "bias"])
def test_group_norm_affine_rounds_once(rng, affine, dtype):
    """The affine step per channel runs in the normalising pass, on the normalised values in the
    accumulation dtype, rounded once: bit for bit layer_norm's float32 (float64) xhat times the
    channel's weight plus its bias, computed here in NumPy and rounded to the dtype."""
    shape, groups = (3, 12, 5, 7), 4
    x = ref.random(rng, shape, dtype, scale=2.0) + dtype.type(0.5)
    w = ref.random(rng, shape[1:2], dtype) if "weight" in affine else None
    b = ref.random(rng, shape[1:2], dtype) if "bias" in affine else None
    acc = F64 if dtype == F64 else F32
    xhat = np.asarray(ampc._C._layer_norm(x.reshape(shape[0] * groups, -1), x.size // (shape[0] * groups),
                                          dtype=acc)[0]).reshape(shape)
    want = xhat
    if w is not None:
        want = want * w.astype(acc)[:, None, None]
    if b is not None:
        want = want + b.astype(acc)[:, None, None]
    y = F.group_norm(x, groups, w, b)
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y).view(np.uint8), want.astype(dtype).view(np.uint8))
    # the backward's weight gradients per channel, summed in the same pass as dx: against float64's
    g = ref.random(rng, shape, dtype)
    gi, gw, gb = F.group_norm_backward(g, x, groups, w, b)
    xhat64 = group_norm_ref(x, groups)
    for got, want64, present in ((gw, (f64(g) * xhat64).sum((0, 2, 3)), w), (gb, f64(g).sum((0, 2, 3)), b)):
        if present is None:
            assert got is None
            continue
        assert got.dtype == dtype and got.shape == (shape[1],)
        scale = np.abs(f64(g)).sum((0, 2, 3))  # the terms' size: cancellation leaves the sums small
        np.testing.assert_array_less(np.abs(f64(got) - want64), 4 * ref.RTOL[dtype] * scale + 1e-30)
    want_gi = numeric_grad(lambda v: group_norm_ref(v, groups, None if w is None else f64(w),
                                                    None if b is None else f64(b)), f64(x), f64(g))
    tol = {F32: 2e-4, F16: 2e-2, BF16: 1e-1, F64: 1e-6}[dtype]  # finite differences' own error included
    np.testing.assert_allclose(f64(gi), want_gi, atol=tol * (1 + np.abs(want_gi).max()))


def test_group_norm_of_an_empty_batch(rng):
    """As torch: an empty output, and zero weight and bias gradients (the rows were taken from the
    element count, 0 here, and layer_norm refused to normalise over 0 elements)."""
    x = np.zeros((0, 4, 3), F32)
    w, b = ref.random(rng, (4,), F32), ref.random(rng, (4,), F32)
    assert F.group_norm(x, 2, w, b).shape == (0, 4, 3)
    gi, gw, gb = F.group_norm_backward(x, x, 2, w, b)
    assert gi.shape == (0, 4, 3) and not gw.any() and not gb.any()


def test_group_norm_bad_input(rng):
    x = ref.random(rng, (2, 6, 4), F32)
    with pytest.raises(ValueError, match="divisible by num_groups"):
        F.group_norm(x, 4)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.group_norm(x[0, 0], 1)
    for name, args in (("weight", (np.ones(4, F32), None)), ("bias", (None, np.ones(12, F32)))):
        with pytest.raises(ValueError, match=f"Expected {name} to be a vector of size equal to the number of channels"):
            F.group_norm(x, 2, *args)
    # the C entry's own checks, below the Python ones
    with pytest.raises(ValueError, match="weight has 5 elements where 6 were expected"):
        ampc._C._layer_norm(x.reshape(4, 12), 12, np.ones(5, F32), None, groups=2, channels=6)
    with pytest.raises(ValueError, match="5 channels in 2 groups do not divide rows of 12 elements"):
        ampc._C._layer_norm_backward(x.reshape(4, 12), x.reshape(4, 12), np.zeros(4, F32), np.ones(4, F32), 12,
                                     groups=2, channels=5)


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------

def sdpa_ref(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = f64(q), f64(k), f64(v)
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + f64(mask)
    dead = np.all(s == -np.inf, -1, keepdims=True)  # torch 2.5 on: a row attending to nothing is 0
    s = np.where(dead, 0.0, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.where(dead, 0.0, p) @ v


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S", [(5, 7), (6, 6), (1, 3)])
def test_sdpa(rng, dtype, causal, L, S):
    q = ref.random(rng, (2, 3, L, 8), dtype)
    k = ref.random(rng, (2, 3, S, 8), dtype)
    v = ref.random(rng, (2, 3, S, 5), dtype)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # probabilities are rounded once to the dtype before multiplying v
    rtol = {F32: 1e-5, F16: 4e-3, BF16: 3e-2, F64: 1e-12}[dtype]
    assert_close(out, sdpa_ref(q, k, v, causal=causal), dtype, rtol=rtol, scale=np.abs(f64(v)).max(), what="sdpa")
    # backward against finite differences of the float64 reference
    g = ref.random(rng, out.shape, dtype)
    _, probs, state = _attention._forward(q, k, v, is_causal=causal)
    gq, gk, gv = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
    for got, which in ((gq, 0), (gk, 1), (gv, 2)):
        args = [f64(q), f64(k), f64(v)]

        def fn(t, which=which, args=args):
            a = list(args)
            a[which] = t
            return sdpa_ref(*a, causal=causal)

        want = numeric_grad(fn, args[which].copy(), f64(g))
        assert got.dtype == dtype
        # float64: the finite differences' own error (h = 1e-6) dominates
        np.testing.assert_allclose(f64(got), want, atol=max(rtol * 20, 1e-7) * (1 + np.abs(want).max()))


def test_fused_attention_serves_no_numpy_arrays(rng):
    """The fused kernels are the GPU's: on NumPy arrays _attention answers None (composed instead),
    and its backward refuses nothing it has not read."""
    q = ref.random(rng, (1, 2, 4, 64), F16)
    assert ampc._C._attention(q, q, q, True, 0.125) is None
    assert ampc._C._attention_backward(q, q, q, q, q, q[..., 0].astype(F32), True, 0.125) is None
    with pytest.raises(TypeError, match="scaled_dot_product_attention: query must be an array"):
        ampc._C._attention(None, q, q, True, 0.125)


def test_sdpa_with_no_embedding_is_the_mean_of_the_values(rng):
    """E = 0: every score an empty sum, 0 (torch's too); the default scale 1 / sqrt(0) was a
    ZeroDivisionError. Causal: row i the mean of the first i + 1 values; gradients flow to v alone."""
    q, k = np.ones((2, 3, 0), F64), np.ones((2, 4, 0), F64)
    v = ref.random(rng, (2, 4, 5), F64)
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v), np.repeat(v.mean(1, keepdims=True), 3, 1))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    np.testing.assert_allclose(causal, np.cumsum(v, 1)[:, :3] / np.arange(1, 4)[None, :, None])
    probs = _attention._forward(q, k, v)[1]
    g = ref.random(rng, (2, 3, 5), F64)
    gq, gk, gv = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
    assert gq.shape == q.shape and gk.shape == k.shape
    np.testing.assert_allclose(gv, np.repeat(g.sum(1, keepdims=True) / 4, 4, 1))


def test_sdpa_masks_scale_dropout(rng):
    q, k, v = (ref.random(rng, s, F32) for s in [(2, 4, 6), (2, 5, 6), (2, 5, 3)])
    mask = rng.random((4, 5)) > 0.3
    mask[:, 0] = True
    assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), sdpa_ref(q, k, v, mask=mask), F32,
                 rtol=1e-5, what="boolean mask")
    add = ref.random(rng, (2, 4, 5), F32)
    assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=add, scale=0.3),
                 sdpa_ref(q, k, v, mask=add, scale=0.3), F32, rtol=1e-5, what="additive mask, scale")
    ampc.manual_seed(3)
    out, probs, state = _attention._forward(q, k, v, dropout_p=0.5)
    dropped = ampc._C._dropout(probs, 0.5, *state)
    assert_close(out, f64(dropped) @ f64(v), F32, rtol=1e-5, what="dropout")
    with pytest.raises(ValueError, match="is_causal"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(ValueError, match="features"):
        F.scaled_dot_product_attention(q, k[..., :5], v)
    with pytest.raises(ValueError, match="positions"):
        F.scaled_dot_product_attention(q, k, v[:, :4])


@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_rows_that_attend_to_nothing_are_zero(rng, gqa):
    """A query whose every key is masked (a boolean row of False, an additive row of -inf) gives 0, as
    torch's since 2.5 (the softmax of -inf alone was NaN), its gradients 0 and nothing else moved."""
    q, k, v = ref.random(rng, (2, 4 if gqa else 2, 5, 6), F64), ref.random(rng, (2, 2, 7, 6), F64), \
        ref.random(rng, (2, 2, 7, 3), F64)
    mask = rng.random((4 if gqa else 2, 5, 7)) > 0.3
    mask[..., 0] = True
    mask[1, 2] = False
    mask[0, 4] = False
    add = np.where(mask, 0.0, -np.inf) + np.where(mask, ref.random(rng, mask.shape, F64), 0.0)
    for m in (mask, add):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)
        assert_close(out, sdpa_ref(q, np.repeat(k, 2, 1) if gqa else k, np.repeat(v, 2, 1) if gqa else v, mask=m),
                     F64, rtol=1e-12)
        assert not np.isnan(out).any() and not out[:, 1, 2].any() and not out[:, 0, 4].any()
        g = ref.random(rng, out.shape, F64)
        probs = _attention._forward(q, k, v, attn_mask=m, enable_gqa=gqa)[1]
        gq, gk, gv = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
        assert not gq[:, 1, 2].any() and not gq[:, 0, 4].any()

        def fn(t, which, args=(q, k, v)):
            a = list(args)
            a[which] = t
            kk, vv = (np.repeat(a[1], 2, 1), np.repeat(a[2], 2, 1)) if gqa else (a[1], a[2])
            return sdpa_ref(a[0], kk, vv, mask=m)

        for got, which in ((gq, 0), (gk, 1), (gv, 2)):
            want = numeric_grad(lambda t, w=which: fn(t, w), (q, k, v)[which].copy(), g)
            np.testing.assert_allclose(got, want, atol=1e-7 * (1 + np.abs(want).max()))


def test_sdpa_dropout_draws_its_mask_once(rng):
    """The public op, its forward with probabilities, the tape and the fused kernels' entry all draw
    one (seed, offset) of B*H*L*S numbers for the mask, before choosing a path: one seed drops the
    same elements whichever runs (on a GPU, the fused kernels take the same draw)."""
    q, k, v = (ref.random(rng, s, F32) for s in [(2, 3, 4, 6), (2, 3, 5, 6), (2, 3, 5, 3)])
    ampc.manual_seed(11)
    want, _, state = _attention._forward(q, k, v, dropout_p=0.4)
    after = ampc.random.get_rng_state()
    ampc.manual_seed(11)
    assert _attention.draw_dropout(q, k, 0.4) == state and ampc.random.get_rng_state() == after
    ampc.manual_seed(11)
    np.testing.assert_array_equal(F.scaled_dot_product_attention(q, k, v, dropout_p=0.4), want)
    ampc.manual_seed(11)
    qp = ampc.nn.Parameter(q.copy())
    np.testing.assert_array_equal(np.asarray(F.scaled_dot_product_attention(qp, k, v, dropout_p=0.4).data), want)
    assert _attention.draw_dropout(q, k, 0.0) is None
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1.5)


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("length", [8, 13, 19])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_sdpa_causal_by_bands(rng, monkeypatch, dtype, length, gqa):
    """A causal self-attention composed a band of queries at a time (bands of 4 rows here, 256 in
    use): the output the whole matrix gives, and through the tape the three gradients against the
    float64 reference's finite differences, the last band short and grouped query heads too."""
    monkeypatch.setattr(_attention, "CAUSAL_BAND_ROWS", 4)
    heads = 4 if gqa else 2
    q = ref.random(rng, (2, heads, length, 8), dtype)
    k, v = ref.random(rng, (2, 2, length, 8), dtype), ref.random(rng, (2, 2, length, 5), dtype)
    bands = _attention.causal_bands(q, k, None, 0.0, True)
    assert len(bands) == min(4, -(-length // 4)) and bands[-1][1] == length
    rtol = {F32: 1e-5, F16: 4e-3, BF16: 3e-2, F64: 1e-12}[dtype]
    whole, _, _ = _attention._forward(q, k, v, is_causal=True, enable_gqa=gqa)
    qp, kp, vp = (ampc.nn.Parameter(a.copy()) for a in (q, k, v))
    out = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=gqa)
    kk, vv = (np.repeat(a, heads // 2, 1) for a in (k, v))
    assert out.dtype == dtype
    assert_close(np.asarray(out.data), sdpa_ref(q, kk, vv, causal=True), dtype, rtol=rtol,
                 scale=np.abs(f64(v)).max(), what="by bands")
    assert_close(np.asarray(out.data), f64(whole), dtype, rtol=rtol, scale=np.abs(f64(v)).max(),
                 what="by bands against the whole matrix")
    g = ref.random(rng, out.shape, dtype)
    F.sum(F.mul(out, g)).backward()
    for got, which in ((qp.grad, 0), (kp.grad, 1), (vp.grad, 2)):
        args = [f64(q), f64(kk), f64(vv)]

        def fn(t, which=which, args=args):
            a = list(args)
            a[which] = np.repeat(t, heads // 2, 1) if which and gqa else t
            return sdpa_ref(*a, causal=True)

        want = numeric_grad(fn, f64((q, k, v)[which]).copy(), f64(g))
        assert got.dtype == dtype
        np.testing.assert_allclose(f64(got), want, atol=max(rtol * 20, 1e-7) * (1 + np.abs(want).max()))


def test_sdpa_bands_only_where_they_serve(rng, monkeypatch):
    """Bands take causal self-attention without a mask or dropout, two bands or more; each band's
    softmax rows see the keys up to their own query (causal_offset), and the offset is checked."""
    monkeypatch.setattr(_attention, "CAUSAL_BAND_ROWS", 4)
    q = ref.random(rng, (1, 2, 12, 8), F32)
    bands = _attention.causal_bands
    assert bands(q, q, None, 0.0, True) == [(0, 4), (4, 8), (8, 12)]
    assert bands(q, q, None, 0.0, False) is None
    assert bands(q, q, np.ones((12, 12), bool), 0.0, True) is None
    assert bands(q, q, None, 0.1, True) is None
    assert bands(q, q[..., :11, :], None, 0.0, True) is None  # as many queries as keys
    assert bands(q[..., :7, :], q[..., :7, :], None, 0.0, True) is None  # one band only
    monkeypatch.setattr(_attention, "CAUSAL_BAND_ROWS", 256)
    long = np.zeros((1, 1, 2048, 1), F32)
    assert bands(long, long, None, 0.0, True) == [(0, 512), (512, 1024), (1024, 1536), (1536, 2048)]
    scores = ref.random(rng, (2, 3, 5, 9), F32)
    whole = ampc._C._softmax(np.concatenate([np.zeros((2, 3, 4, 9), F32), scores], 2), -1, False, causal=True)
    np.testing.assert_array_equal(ampc._C._softmax(scores, -1, False, causal=True, causal_offset=4),
                                  whole[:, :, 4:])
    np.testing.assert_array_equal(ampc._C._softmax(scores, -1, False, causal=True, causal_offset=2 ** 63 - 1),
                                  ampc._C._softmax(scores, -1, False))
    with pytest.raises(ValueError, match="causal_offset must be 0 or more"):
        ampc._C._softmax(scores, -1, False, causal=True, causal_offset=-1)
    with pytest.raises(ValueError, match="comes with causal=True"):
        ampc._C._softmax(scores, -1, False, causal_offset=1)


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_autocast_dtypes_of_the_layer_ops(rng, dtype):
    """torch's CPU autocast: sdpa on the lower list, group_norm float32 where listed, the rest as called."""
    q = ref.random(rng, (2, 4, 8), F32)
    x = ref.random(rng, (2, 4, 3), F32)
    w = ampc.Parameter(ref.random(rng, (4,), F32))
    with ampc.autocast("cpu", dtype=dtype):
        assert F.scaled_dot_product_attention(q, q, q).dtype == dtype
        assert F.embedding(np.array([1, 2]), ref.random(rng, (5, 3), F32)).dtype == F32
        assert F.dropout(x, 0.1).dtype == F32
        assert F.cat([x.astype(dtype), x], 0).dtype == F32  # promote
        gn_policy = ampc.autocast_policy("group_norm", "cpu")
        assert F.group_norm(x.astype(dtype), 2, w).dtype == (F32 if gn_policy == "fp32" else dtype)


# --------------------------------------------------------------------------------------------
# Glue
# --------------------------------------------------------------------------------------------

def test_glue_and_backward(rng):
    x = ref.random(rng, (2, 3, 4), F32)
    assert F.reshape(x, (6, 4)).shape == (6, 4) and F.reshape_backward(F.reshape(x, (6, 4)), x.shape).shape == x.shape
    t = F.transpose(x, 0, 2)
    assert np.array_equal(t, x.transpose(2, 1, 0)) and np.array_equal(F.transpose_backward(t, 0, 2), x)
    p = F.permute(x, (2, 0, 1))
    assert np.array_equal(F.permute_backward(p, (2, 0, 1)), x)
    assert F.flatten(x, 1).shape == (2, 12) and F.unsqueeze(x, -1).shape == (2, 3, 4, 1)
    assert F.squeeze(F.unsqueeze(x, 1), 1).shape == x.shape
    ones = x.reshape(2, 1, 3, 1, 4)
    assert F.squeeze(ones, (1, -2)).shape == (2, 3, 4) and F.squeeze(ones, (0, 1)).shape == (2, 3, 1, 4)  # torch 2.0's
    y = ref.random(rng, (2, 5, 4), F32)
    c = F.cat([x, y], 1)
    a, b = F.cat_backward(c, [3, 5], 1)
    assert np.array_equal(a, x) and np.array_equal(b, y)
    s = F.stack([x, x], 0)
    assert s.shape == (2, 2, 3, 4) and all(np.array_equal(u, x) for u in F.stack_backward(s, 2, 0))
    assert [u.shape[2] for u in F.split(x, 3, 2)] == [3, 1] and [u.shape[1] for u in F.chunk(x, 2, 1)] == [2, 1]
    with pytest.raises(IndexError):
        F.transpose(x, 0, 3)
    with pytest.raises(ValueError, match="add up"):
        F.split(x, [1, 1], 1)
    with pytest.raises(TypeError, match="cat: each of tensors must be an array"):
        F.cat([[1.0], [2.0]])
    for count in (1, 3, 10**30):  # 10**30 ran out of memory making slices
        with pytest.raises(ValueError, match=rf"stack_backward: count \({count}\) must be grad_output's size"):
            F.stack_backward(s, count, 0)


@pytest.mark.parametrize("dtypes,want", [
    ((F32, np.int32), F32),            # NumPy: float64
    ((F16, np.int16), F16),            # NumPy: float32
    ((F16, BF16), F32),
    ((BF16, np.bool_, np.int64), BF16),
    ((np.int8, np.uint8), np.int16),
    ((np.bool_, np.uint8), np.uint8),
    ((F16, F64), F64),
], ids=str)
@pytest.mark.parametrize("library", ["numpy", "ampc"])
def test_cat_and_stack_promote_as_torch(rng, dtypes, want, library):
    """torch's promotion, not NumPy's (which made float32 with int32 float64) nor the first array's
    dtype (which ampc's own arrays took: float16 with float32 was float16); the values converted."""
    want = np.dtype(want)
    parts = [(rng.standard_normal((2, 3)) * 100).astype(d) for d in dtypes]
    wrap = ampc.from_dlpack if library == "ampc" else (lambda a: a)
    if library == "ampc" and want.kind in "biu":  # ampc's arrays convert to floating dtypes only
        with pytest.raises(TypeError, match=f"cat: ampc's arrays convert to floating dtypes only, not .* to {want}"):
            F.cat([wrap(p) for p in parts])
        return
    # the reference joins the parts converted to the result's dtype (the values are what is checked):
    # older ml_dtypes have no NumPy promotion between bfloat16 and float16 or int64
    same = [p.astype(want) for p in parts]
    for got, joined in [(F.cat([wrap(p) for p in parts], 1), np.concatenate(same, 1)),
                        (F.stack([wrap(p) for p in parts], 0), np.stack(same, 0))]:
        got = np.asarray(got)
        assert got.dtype == want
        np.testing.assert_array_equal(got, joined.astype(np.float64).astype(want) if want.kind not in "biu" else joined)


def test_cat_and_stack_refuse_as_torch(rng):
    """torch's texts for mismatched shapes, a 0-d array and arrays of two libraries (the errors spoke of
    ampc.cast's out=); a 1-D empty array joins anything, as torch's legacy empty tensor."""
    x, y = rng.standard_normal((2, 3)).astype(F32), rng.standard_normal((2, 4)).astype(F32)
    for wrap in (lambda a: a, ampc.from_dlpack):
        with pytest.raises(ValueError, match=r"cat: Sizes of tensors must match except in dimension 0. Expected "
                                             r"size 3 but got size 4 for tensor number 1 in the list"):
            F.cat([wrap(x), wrap(y)])
        with pytest.raises(ValueError, match=r"stack: stack expects each tensor to be equal size, but got \[2, 3\] "
                                             r"at entry 0 and \[2, 4\] at entry 1"):
            F.stack([wrap(x), wrap(y)])
        with pytest.raises(ValueError, match="Tensors must have same number of dimensions: got 2 and 1"):
            F.cat([wrap(x), wrap(x[0])])
    with pytest.raises(ValueError, match=r"zero-dimensional tensor \(at position 1\) cannot be concatenated"):
        F.cat([x, np.float32(1.0) * np.ones((), F32)])
    with pytest.raises(TypeError, match="cat: expected arrays of one library, got ndarray .* and Array"):
        F.cat([x, ampc.from_dlpack(x)])
    joined = F.cat([np.zeros(0, np.float64), x, np.zeros(0, F32)], 1)
    assert joined.dtype == F64 and np.array_equal(joined, x)


@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_grouped_query_heads(rng, dtype, causal):
    """enable_gqa: 6 query heads on 2 key/value heads equal the float64 reference with each key and
    value head repeated for its 3 query heads; their gradients are the repeated heads' gradients
    summed."""
    q = ref.random(rng, (2, 6, 5, 8), dtype)
    k, v = ref.random(rng, (2, 2, 7, 8), dtype), ref.random(rng, (2, 2, 7, 4), dtype)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    k3, v3 = np.repeat(f64(k), 3, axis=1), np.repeat(f64(v), 3, axis=1)
    rtol = {F32: 1e-5, BF16: 3e-2}[dtype]
    assert out.shape == (2, 6, 5, 4) and out.dtype == dtype
    assert_close(out, sdpa_ref(q, k3, v3, causal=causal), dtype, rtol=rtol, scale=np.abs(f64(v)).max(), what="gqa")
    g = ref.random(rng, out.shape, dtype)
    _, probs, _ = _attention._forward(q, k, v, is_causal=causal, enable_gqa=True)
    gq, gk, gv = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
    rq, rk, rv = F.scaled_dot_product_attention_backward(
        f64(g), f64(q), k3, v3, _attention._forward(f64(q), k3, v3, is_causal=causal)[1])
    assert gq.shape == q.shape and gk.shape == k.shape and gv.shape == v.shape
    for got, want, name in ((gq, rq, "q"), (gk, rk.reshape(2, 2, 3, 7, 8).sum(2), "k"),
                            (gv, rv.reshape(2, 2, 3, 7, 4).sum(2), "v")):
        np.testing.assert_allclose(f64(got), want, atol=rtol * 20 * (1 + np.abs(want).max()), err_msg=name)
    with pytest.raises(ValueError, match="enable_gqa=True lets query have a multiple"):
        F.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, np.inf])
def test_embedding_max_norm(rng, norm_type):
    """torch's max_norm: the rows looked up whose norm exceeds max_norm are scaled in place by
    max_norm / (norm + 1e-7) before the lookup; other rows stay as they were."""
    w = ref.random(rng, (7, 5), F32) * 3
    before = w.copy()
    idx = np.array([[0, 3], [3, 6]])
    y = F.embedding(idx, w, max_norm=1.5, norm_type=norm_type)
    for row in range(7):
        norm = np.linalg.norm(before[row].astype(np.float64), ord=norm_type)
        if row in (0, 3, 6) and norm > 1.5:
            np.testing.assert_allclose(w[row], before[row] * (1.5 / (norm + 1e-7)), rtol=1e-6)
        else:
            np.testing.assert_array_equal(w[row], before[row])
    np.testing.assert_array_equal(y, w[idx])
    layer = ampc.nn.Embedding(7, 5, max_norm=1.0)
    layer(np.array([2, 4]))
    assert np.linalg.norm(layer.weight.data[[2, 4]].astype(np.float64), axis=1).max() <= 1.0 + 1e-6


@pytest.mark.parametrize("idx, error, match", [
    (np.array([0, -1]), ValueError, "index -1"),     # torch's renorm took -1 for row 4: rows 0 and 4 rescaled
    (np.array([[1], [5]]), ValueError, "index 5"),
    (np.array([0.0, 1.0]), TypeError, "indices"),    # float indices: NumPy picked rows 0 and 1 first
    (np.array([0, 1], np.uint16), TypeError, "uint16"),
])
def test_embedding_max_norm_refused_changes_no_row(idx, error, match):
    """A lookup that will be refused renormalises nothing: every check runs before max_norm writes."""
    w = np.arange(10, dtype=np.float32).reshape(5, 2) + 1  # every row's norm above 1
    before = w.copy()
    with pytest.raises(error, match=match):
        F.embedding(idx, w, max_norm=1.0)
    np.testing.assert_array_equal(w, before)
    layer = ampc.nn.Embedding(5, 2, max_norm=1.0)
    kept = layer.weight.data.copy()
    with pytest.raises(error, match=match):
        layer(idx)
    np.testing.assert_array_equal(layer.weight.data, kept)
    assert layer.weight._version == 0


@pytest.mark.parametrize("padding_idx", [5, -6])
def test_embedding_layer_padding_idx_outside_the_table(padding_idx):
    """torch asserts it in the constructor; -6 of 5 rows silently zeroed row 4 (-6 + 5 = -1)."""
    with pytest.raises(ValueError, match="Padding_idx must be within num_embeddings"):
        ampc.nn.Embedding(5, 2, padding_idx=padding_idx)
