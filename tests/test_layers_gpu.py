"""The layer ops on CUDA tensors: embedding (the CPU's bits for its gradient), dropout (the CPU's
mask for one seed), group_norm and scaled_dot_product_attention against torch and float64
references, causal softmax, the dtypes torch's CUDA autocast gives them, bad input."""

import math

import numpy as np
import pytest

import ampc
from ampc.nn import _attention, _embedding

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from test_ops_gpu import (FLOATS, ID, RTOL, autograd, close, randn, seed,  # noqa: E402,F401 (seed: the autouse fixture)
                          strided)

TF = torch.nn.functional
F = ampc.nn.functional


def numpy_of(t):
    """A CPU NumPy copy (bfloat16 through ml_dtypes)."""
    if t.dtype == torch.bfloat16:
        return t.cpu().view(torch.int16).numpy().view(ampc.bfloat16)
    return t.cpu().numpy()


def bits(t):
    return t.contiguous().view(torch.uint8).cpu() if isinstance(t, torch.Tensor) else torch.from_numpy(
        np.ascontiguousarray(t).view(np.uint8))


def test_embedding_max_norm_refused_changes_no_row():
    """An index outside the table is refused before max_norm writes (torch's renorm took -1 for the
    last row; a GPU lookup gives NaN rather than looking)."""
    w = torch.arange(10, dtype=torch.float32, device="cuda").reshape(5, 2) + 1
    before = w.clone()
    for idx in ([0, -1], [0, 5]):
        with pytest.raises(ValueError, match="outside the 5 rows"):
            F.embedding(torch.tensor(idx, device="cuda"), w, max_norm=1.0)
        assert torch.equal(w, before)
    y = F.embedding(torch.tensor([1], device="cuda"), w, max_norm=1.0)
    want = before[1].double() / (before[1].double().norm() + 1e-7)
    assert torch.allclose(y[0].double(), want, rtol=1e-6) and torch.equal(w[0], before[0])


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_embedding(dtype):
    w = randn(50, 33, dtype=dtype)
    idx = torch.randint(0, 50, (7, 9), device="cuda")
    idx[0, :4] = 3
    y = F.embedding(idx, w)
    assert torch.equal(y, TF.embedding(idx, w))
    dy = randn(7, 9, 33, dtype=dtype)
    for padding_idx in (None, 3):
        gw = F.embedding_backward(dy, idx, 50, padding_idx)
        want = autograd(lambda v: TF.embedding(idx, v, padding_idx=padding_idx), [w], dy)[0]
        close(gw, want, dtype, scale=dy.double().abs().max().item() * 4, what="embedding grad vs float64")
        # the CPU sums each row over its positions in the same order: the same bits
        cpu = F.embedding_backward(numpy_of(dy), idx.cpu().numpy(), 50, padding_idx)
        assert torch.equal(bits(gw), bits(cpu)), "GPU and CPU embedding gradients differ"
    want = autograd(lambda v: TF.embedding(idx, v, scale_grad_by_freq=True), [w], dy)[0]
    close(F.embedding_backward(dy, idx, 50, scale_grad_by_freq=True), want, dtype,
          scale=dy.double().abs().max().item() * 4, what="embedding grad scaled by frequency")


def test_embedding_out_of_range_is_nan():
    """No host synchronisation: an index outside the table gives a NaN row, not a read outside it."""
    w = randn(5, 4)
    y = F.embedding(torch.tensor([1, 5, -1], device="cuda"), w)
    assert torch.equal(y[0], w[1]) and y[1:].isnan().all()
    g = F.embedding_backward(torch.ones(3, 4, device="cuda"), torch.tensor([1, 7, 1], device="cuda"), 5)
    assert torch.equal(g[1], torch.full((4,), 2.0, device="cuda")) and g[[0, 2, 3, 4]].eq(0).all()


def test_embedding_long_runs():
    """Many positions naming one row (a warp adds them in order) and a large table."""
    w = randn(50257, 64, dtype=torch.float16)
    idx = torch.randint(0, 50257, (4096,), device="cuda")
    idx[:2000] = 7
    dy = randn(4096, 64, dtype=torch.float16)
    gw = F.embedding_backward(dy, idx, 50257)
    assert torch.equal(bits(gw), bits(F.embedding_backward(numpy_of(dy), idx.cpu().numpy(), 50257)))


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_dropout_mask_is_the_cpus(dtype):
    x = randn(1000, 37, dtype=dtype)
    ampc.manual_seed(99)
    y, state = _embedding.dropout_forward(x, 0.2)
    cpu = ampc._C._dropout(numpy_of(x), 0.2, *state)
    assert torch.equal(bits(y), bits(cpu)), "GPU and CPU dropout differ for one seed and offset"
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.8) < 0.01
    g = randn(1000, 37, dtype=dtype)
    assert torch.equal(bits(F.dropout_backward(g, state, 0.2)), bits(ampc._C._dropout(numpy_of(g), 0.2, *state)))


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("shape,groups", [((4, 32, 7, 7), 8), ((2, 6, 33), 3), ((3, 64, 1, 1), 64),
                                          ((3, 40, 5), 8), ((2, 8, 40, 40), 2), ((4, 16, 8, 8), 4),
                                          ((1, 14, 32, 32), 1), ((2, 4, 64, 64), 2), ((2, 16, 7, 7), 2),
                                          ((2, 64, 9, 9), 4), ((1, 8, 45, 45), 1)], ids=str)
def test_group_norm(shape, groups, dtype):
    """Channels of 49, 33, 1 and 5 elements: the generic kernels' thread, warp and block per channel;
    channels of 1600, 64, 1024 and 4096 (whole 16-byte packs): the streamed kernels' block and warp per
    row and per channel, and dx of a row in runs of channels (14 channels in runs of 5, 5 and 4); rows of
    whole packs whose channels are not (392, 1296 and 16200 elements of channels of 49, 81 and 2025): the
    forward's rows held in registers, a warp, 4 warps and a block a row."""
    x = randn(*shape, dtype=dtype, scale=2.0) + 0.5
    w, b = randn(shape[1], dtype=dtype), randn(shape[1], dtype=dtype)
    fn = lambda v, wt, bs: TF.group_norm(v, groups, wt, bs)  # noqa: E731
    want64 = fn(x.double(), w.double(), b.double())
    close(F.group_norm(x, groups, w, b), want64, dtype, rtol=2 * RTOL[dtype], what="group_norm")
    close(F.group_norm(x, groups), TF.group_norm(x.double(), groups), dtype, rtol=2 * RTOL[dtype],
          what="group_norm without affine")
    g = randn(*shape, dtype=dtype)
    gi, gw, gb = F.group_norm_backward(g, x, groups, w, b)
    egi, egw, egb = autograd(fn, [x, w, b], g)
    red = g.double().abs().sum() / shape[1]
    # scale: the incoming gradient (a group of one element has a zero gradient, which both sides
    # reach only up to rounding)
    close(gi, egi, dtype, rtol=8 * RTOL[dtype], scale=g.double().abs().max().item(), what="grad_input")
    close(gw, egw, dtype, rtol=8 * RTOL[dtype], scale=red.item() * 3, what="grad_weight")
    close(gb, egb, dtype, rtol=8 * RTOL[dtype], scale=red.item(), what="grad_bias")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("alone", ["weight", "bias"])
@pytest.mark.parametrize("shape", [(3, 12, 5, 9), (2, 12, 4, 8), (2, 12, 4, 6)], ids=str)
def test_group_norm_weight_or_bias_alone(shape, alone, dtype):
    """group_norm's affine step with one of its two arrays: forward, dx with the channel's weight (or
    none), and that array's gradient, against float64's; generic, streamed and (16-bit rows of 72 elements) held kernels."""
    groups = 4
    x = randn(*shape, dtype=dtype, scale=2.0) + 0.5
    p = randn(shape[1], dtype=dtype)
    w, b = (p, None) if alone == "weight" else (None, p)
    # torch 2.11's CUDA backward of group_norm with a bias and no weight raises "tensor does not have a
    # device": its reference takes a weight of ones (the same function) that needs no gradient
    ones = torch.ones(shape[1], device="cuda", dtype=torch.float64)
    fn = (lambda v, q: TF.group_norm(v, groups, q, None)) if w is not None else (  # noqa: E731
        lambda v, q: TF.group_norm(v, groups, ones, q))
    close(F.group_norm(x, groups, w, b), fn(x.double(), p.double()), dtype, rtol=2 * RTOL[dtype],
          what=f"group_norm with its {alone} alone")
    g = randn(*shape, dtype=dtype)
    gi, gw, gb = F.group_norm_backward(g, x, groups, w, b)
    egi, egp = autograd(fn, [x, p], g)
    close(gi, egi, dtype, rtol=8 * RTOL[dtype], scale=g.double().abs().max().item(), what="grad_input")
    got = gw if w is not None else gb
    assert (gb if w is not None else gw) is None
    close(got, egp, dtype, rtol=8 * RTOL[dtype], scale=3 * g.double().abs().sum().item() / shape[1],
          what=f"grad_{alone}")


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
def test_group_norm_layouts_and_dx_alone(dtype):
    """Channels-last and stepped inputs give the contiguous input's bits (the kernels see the same rows),
    and dx without the weight gradients is the same dx; a channel of 32 elements (streamed)."""
    x = randn(3, 12, 8, 4, dtype=dtype, scale=2.0) + 0.5
    w, b, g = randn(12, dtype=dtype), randn(12, dtype=dtype), randn(3, 12, 8, 4, dtype=dtype)
    y = F.group_norm(x, 4, w, b)
    grads = F.group_norm_backward(g, x, 4, w, b)
    for other in (x.contiguous(memory_format=torch.channels_last), strided(x)):
        assert torch.equal(bits(F.group_norm(other, 4, w, b)), bits(y))
        for got, want in zip(F.group_norm_backward(g, other, 4, w, b), grads):
            assert torch.equal(bits(got), bits(want))
    gi, gw, gb = F.group_norm_backward(g, x, 4, w, b, weight_grads=False)
    assert gw is None and gb is None and torch.equal(bits(gi), bits(grads[0]))


SDPA_RTOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float64: 1e-12}


@pytest.mark.parametrize("dtype", FLOATS, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S,E", [(64, 64, 64), (33, 70, 16), (1024, 1024, 64)], ids=str)
def test_sdpa(L, S, E, causal, dtype):
    q, k, v = randn(2, 4, L, E, dtype=dtype), randn(2, 4, S, E, dtype=dtype), randn(2, 4, S, E, dtype=dtype)
    fn = lambda a, b, c: TF.scaled_dot_product_attention(a, b, c, is_causal=causal)  # noqa: E731
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    rtol = SDPA_RTOL[dtype]
    close(out, fn(q.double(), k.double(), v.double()), dtype, rtol=rtol, scale=1.0, what="sdpa vs float64")
    close(out, fn(q, k, v), dtype, rtol=2 * rtol, scale=1.0, what="sdpa vs torch")
    g = randn(*out.shape, dtype=dtype)
    _, probs, _ = _attention._forward(q, k, v, is_causal=causal)
    got = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
    want = autograd(fn, [q, k, v], g)
    for name, a, b in zip("qkv", got, want):
        close(a, b, dtype, rtol=8 * rtol, scale=b.abs().max().item(), what=f"grad_{name}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("L,S", [(40, 64), (6, 1024), (3, 5000), (5, 70)], ids=str)
def test_attention_probabilities_round_once_from_float32_scores(L, S, causal, dtype):
    """The float32 scores' softmax rounded once to the 16-bit probabilities (a warp's registers hold a
    row of 64 or 1024, a block's 5000; 70 is no whole number of 16-byte packs), a causal row's masked
    end exactly zero whether or not it was read."""
    q, k = randn(2, 3, L, 32, dtype=dtype), randn(2, 3, S, 32, dtype=dtype)
    got = _attention.probabilities(q, k, is_causal=causal)
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)
    if causal:
        scores = scores.masked_fill(~torch.ones(L, S, device="cuda", dtype=torch.bool).tril(), -math.inf)
    close(got, torch.softmax(scores, -1), dtype, rtol=RTOL[dtype], scale=0.0, what="probabilities")
    if causal:
        assert torch.equal(got.triu(1), torch.zeros_like(got))


def test_sdpa_mask_and_autocast():
    q, k, v = randn(2, 8, 16), randn(2, 12, 16), randn(2, 12, 16)
    mask = torch.rand(8, 12, device="cuda") > 0.3
    mask[:, 0] = True
    close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
          TF.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask), torch.float32,
          scale=1.0, what="boolean mask")
    mask[3] = False  # a query that attends to nothing: 0, as torch (2.5 on), not NaN
    for m in (mask, torch.zeros(8, 12, device="cuda").masked_fill(~mask, float("-inf"))):
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        reference_mask = m if m.dtype == torch.bool else m.double()  # torch: a float mask of the query's dtype
        close(got, TF.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=reference_mask),
              torch.float32, scale=1.0, what="a row attending to nothing")
        assert torch.equal(got[:, 3], torch.zeros_like(got[:, 3]))
    for dtype in (torch.float16, torch.bfloat16):
        with ampc.autocast("cuda", dtype=dtype):
            got = F.scaled_dot_product_attention(q, k, v)
            emb = F.embedding(torch.tensor([1], device="cuda"), v[0])
            gn = F.group_norm(q.to(dtype).unsqueeze(-1), 2)
        with torch.autocast("cuda", dtype=dtype):
            want = TF.scaled_dot_product_attention(q, k, v)
            tgn = TF.group_norm(q.to(dtype).unsqueeze(-1), 2)
        assert got.dtype == want.dtype == dtype and emb.dtype == torch.float32 and gn.dtype == tgn.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=ID.get)
@pytest.mark.parametrize("n", [7, 1000, 3000, 20001, 50257, 70001])
def test_causal_softmax_matches_cpu_rule(n, dtype):
    """The kernel's causal mask (every path: cached, block, shared memory, streamed) against a masked
    softmax."""
    x = randn(3, 5, n, dtype=dtype, scale=3.0)
    y = ampc._C._softmax(x, -1, False, None, causal=True)
    keep = torch.ones(5, n, device="cuda", dtype=torch.bool).tril()
    want = torch.softmax(x.double().masked_fill(~keep, float("-inf")), -1)
    close(y, want, dtype, rtol=2 * RTOL[dtype], scale=0.0, what="causal softmax")
    assert y.masked_select(~keep.expand_as(y)).eq(0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_grouped_query_heads(causal):
    q, k, v = randn(2, 8, 33, 16), randn(2, 2, 40, 16), randn(2, 2, 40, 16)
    fn = lambda a, b, c: TF.scaled_dot_product_attention(a, b, c, is_causal=causal, enable_gqa=True)  # noqa: E731
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    close(out, fn(q.double(), k.double(), v.double()), torch.float32, rtol=1e-5, scale=1.0, what="gqa vs float64")
    g = randn(*out.shape)
    _, probs, _ = _attention._forward(q, k, v, is_causal=causal, enable_gqa=True)
    got = F.scaled_dot_product_attention_backward(g, q, k, v, probs)
    for name, a, b in zip("qkv", got, autograd(fn, [q, k, v], g)):
        close(a, b, torch.float32, rtol=1e-4, scale=b.abs().max().item(), what=f"gqa grad_{name}")
