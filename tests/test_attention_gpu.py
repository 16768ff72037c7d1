"""The fused attention kernels (cuda/attention.cu through ampc._C._attention and
_attention_backward): forward, log-sum-exp and the three gradients against float64 references and
torch, causal and not, tails of both lengths, GPT-2's strided head views, the same bits on every
run; what they do not serve answers None and takes the composed path; a GPT trained on them
against the composed path."""

import math

import numpy as np
import pytest

import ampc
from ampc import _C
from ampc.nn import _attention

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
from test_ops_gpu import ID, autograd, close, randn, seed  # noqa: E402,F401 (seed: the autouse fixture)

TF = torch.nn.functional
F = ampc.nn.functional
LOW = [torch.float16, torch.bfloat16]
# The kernels round the probabilities (and dS) to the inputs' dtype before the products, as
# FlashAttention does: a few units of the dtype's rounding, relative to the largest output.
RTOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
SHAPES = [(1, 1, 64, 64), (2, 3, 100, 37), (2, 2, 37, 100), (1, 2, 1, 1), (1, 1, 130, 3), (2, 4, 1024, 1024)]


def sm80():
    return torch.cuda.get_device_capability()[0] >= 8


def operands(shape, dtype):
    """Fresh q (b, h, L, 64), k and v (b, h, S, 64) for shape (b, h, L, S); skips before sm_80."""
    if not sm80():
        pytest.skip("the fused kernels need sm_80")
    b, h, L, S = shape
    return randn(b, h, L, 64, dtype=dtype), randn(b, h, S, 64, dtype=dtype), randn(b, h, S, 64, dtype=dtype)


def heads_of_projection(b, length, h, dtype):
    """q, k, v as GPT-2 makes them: (b, h, length, 64) views of one (b, length, 3 * h * 64) projection."""
    qkv = randn(b, length, 3 * h * 64, dtype=dtype)
    return [z.reshape(b, length, h, 64).transpose(1, 2) for z in qkv.split(h * 64, dim=2)]


def reference(q, k, v, causal):
    return TF.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def scores64(q, k, causal):
    s = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], device="cuda", dtype=torch.bool).tril()
        s = s.masked_fill(~keep, -math.inf)
    return s


# The backward works out dO.v - D (D = dO.O) in float32; where they cancel (one key: P = 1 and the exact
# dq is 0) what is left is float32 rounding of the terms, a few units of 2^-24 of their size.
F32_NOISE = 2.0**-20


def gradient_terms(g, q, k, v):
    """The size of the terms each gradient sums: dq and dk add 0.125 P (dO.v - D) k (or q), with
    |dO.v - D| up to twice max |dO||v|; dv adds P dO."""
    dov = 2 * (g.double().abs() @ v.double().abs().transpose(-1, -2)).max().item()
    return {"q": 0.125 * dov * k.abs().max().item(), "k": 0.125 * dov * q.abs().max().item(),
            "v": g.abs().max().item()}


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward(shape, causal, dtype):
    b, h, L, S = shape
    q, k, v = operands(shape, dtype)
    served = _C._attention(q, k, v, causal, 0.125)
    assert served is not None
    out, lse = served
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (b, h, L)
    close(out, reference(q, k, v, causal), dtype, rtol=RTOL[dtype], scale=1.0, what="output vs float64")
    close(out, TF.scaled_dot_product_attention(q, k, v, is_causal=causal), dtype, rtol=2 * RTOL[dtype], scale=1.0,
          what="output vs torch")
    want = torch.logsumexp(scores64(q, k, causal), -1)
    assert (lse.double() - want).abs().max().item() < 1e-4 * (1 + want.abs().max().item())


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward(shape, causal, dtype):
    q, k, v = operands(shape, dtype)
    out, lse = _C._attention(q, k, v, causal, 0.125)
    g = randn(*q.shape, dtype=dtype)
    got = _C._attention_backward(g, q, k, v, out, lse, causal, 0.125)
    assert got is not None
    want = autograd(lambda x, y, z: TF.scaled_dot_product_attention(x, y, z, is_causal=causal), [q, k, v], g)
    terms = gradient_terms(g, q, k, v)
    for name, a, r in zip("qkv", got, want):
        assert a.shape == r.shape and a.dtype == dtype
        rtol = 8 * RTOL[dtype]
        scale = max(r.abs().max().item(), F32_NOISE * terms[name] / rtol)
        close(a, r, dtype, rtol=rtol, scale=scale, what=f"grad_{name}")
    again = _C._attention_backward(g, q, k, v, out, lse, causal, 0.125)
    for a, r in zip(got, again):
        assert torch.equal(a.view(torch.int16), r.view(torch.int16)), "two runs gave different bits"


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
def test_gpt2_head_views_and_output_layout(dtype):
    """The strided (b, h, L, 64) views of one projection are read in place, and the output (and the
    gradients) come back in the views' memory order: transposed to (b, L, h, 64), dense."""
    if not sm80():
        pytest.skip("the fused kernels need sm_80")
    q, k, v = heads_of_projection(2, 200, 3, dtype)
    assert not q.is_contiguous()
    out, lse = _C._attention(q, k, v, True, 0.125)
    assert out.transpose(1, 2).is_contiguous()
    close(out, reference(q, k, v, True), dtype, rtol=RTOL[dtype], scale=1.0, what="strided output")
    g = randn(2, 200, 3, 64, dtype=dtype).transpose(1, 2)  # the gradient arrives as the output's layout
    got = _C._attention_backward(g, q, k, v, out, lse, True, 0.125)
    want = autograd(lambda x, y, z: TF.scaled_dot_product_attention(x, y, z, is_causal=True), [q, k, v], g)
    for name, a, r in zip("qkv", got, want):
        assert a.transpose(1, 2).is_contiguous()
        close(a, r, dtype, rtol=8 * RTOL[dtype], scale=r.abs().max().item(), what=f"strided grad_{name}")


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1)], ids=str)
def test_grouped_query_heads(heads, kv_heads, causal, dtype):
    """enable_gqa: query head h reads key/value head h // G; the key and value gradients add the
    G heads' up, against torch's enable_gqa through its autograd."""
    if not sm80():
        pytest.skip("the fused kernels need sm_80")
    q = randn(2, heads, 100, 64, dtype=dtype)
    k, v = randn(2, kv_heads, 70, 64, dtype=dtype), randn(2, kv_heads, 70, 64, dtype=dtype)
    fn = lambda x, y, z: TF.scaled_dot_product_attention(x, y, z, is_causal=causal, enable_gqa=True)  # noqa: E731
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    close(out, fn(q.double(), k.double(), v.double()), dtype, rtol=RTOL[dtype], scale=1.0, what="gqa output")
    served = _C._attention(q, k, v, causal, 0.125)
    g = randn(*out.shape, dtype=dtype)
    got = _C._attention_backward(g, q, k, v, *served, causal, 0.125)
    for name, a, r in zip("qkv", got, autograd(fn, [q, k, v], g)):
        assert a.shape == r.shape
        close(a, r, dtype, rtol=8 * RTOL[dtype], scale=r.abs().max().item(), what=f"gqa grad_{name}")


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_drops_what_the_composed_attention_drops(causal, dtype, monkeypatch):
    """Dropout in the kernels takes the composed attention's mask (the same Philox draw, element by
    element), so one seed gives the same output and gradients either way, up to rounding; and
    the mask really drops (p = 0.4 moves the output by far more than rounding)."""
    if not sm80():
        pytest.skip("the fused kernels need sm_80")
    q, k, v = (randn(2, 4, n, 64, dtype=dtype) for n in (100, 77, 77))
    g = randn(2, 4, 100, 64, dtype=dtype)

    def run():
        ampc.manual_seed(5)
        served = _attention.fused_forward(q, k, v, dropout_p=0.4, is_causal=causal,
                                          dropout_state=_attention.draw_dropout(q, k, 0.4))
        ampc.manual_seed(5)
        out, probs, state = _attention._forward(q, k, v, dropout_p=0.4, is_causal=causal)
        grads = F.scaled_dot_product_attention_backward(g, q, k, v, probs, 0.4, None, state)
        return served, out, grads

    served, composed, composed_grads = run()
    assert served is not None
    out, fused = served
    assert fused.dropout_p == 0.4 and fused.dropout_state is not None
    close(out, composed.double(), dtype, rtol=2 * RTOL[dtype], scale=1.0, what="dropped output vs composed")
    undropped = _C._attention(q, k, v, causal, 0.125)[0]
    assert (out.double() - undropped.double()).abs().max().item() > 0.1
    got = _attention.fused_backward(g, q, k, v, fused, causal)
    for name, a, r in zip("qkv", got, composed_grads):
        close(a, r.double(), dtype, rtol=16 * RTOL[dtype], scale=r.double().abs().max().item(),
              what=f"dropped grad_{name} vs composed")


@pytest.mark.parametrize("dtype", LOW, ids=ID.get)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keys", [64, 1024, 5000, 70])
def test_composed_probabilities_of_three_queries(keys, causal, dtype):
    """The composed path's probabilities (the product in float32, then the softmax) for few queries
    against many keys, the shapes compute-sanitizer's tour runs (initcheck reported the softmax's
    reads of the product's output there): every element against float64."""
    q, k = randn(1, 2, 3, 32, dtype=dtype), randn(1, 2, keys, 32, dtype=dtype)
    got = _attention.probabilities(q, k, is_causal=causal)
    assert got.dtype == dtype and got.shape == (1, 2, 3, keys)
    want = torch.softmax(scores64(q, k, causal), -1)
    close(got, want, dtype, rtol=RTOL[dtype], scale=want.abs().max().item(), what="probabilities")


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("length", [1024, 45])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=ID.get)
def test_causal_attention_by_bands(monkeypatch, dtype, length, gqa):
    """The host's composition by bands of queries (the softmax's causal_offset) run on GPU arrays
    (1024 queries: four bands of 256; 45 with bands of 16 rows, the last short): the output and
    the three gradients against torch's in float64. The public op on a GPU composes the whole
    matrix (faster in GPT-2's step there): the same values."""
    if length < 2 * _attention.CAUSAL_BAND_ROWS:
        monkeypatch.setattr(_attention, "CAUSAL_BAND_ROWS", 16)
    heads = 4 if gqa else 2
    q = randn(2, heads, length, 32, dtype=dtype)
    k, v = randn(2, 2, length, 32, dtype=dtype), randn(2, 2, length, 32, dtype=dtype)
    g = randn(2, heads, length, 32, dtype=dtype)
    assert _attention.causal_bands(q, k, None, 0.0, True) is None
    monkeypatch.setattr(_attention, "_on_host", lambda x: True)
    bands = _attention.causal_bands(q, k, None, 0.0, True)
    assert len(bands) >= 3
    rtol = {torch.float32: 2e-5, torch.float16: RTOL[torch.float16]}[dtype]
    want_out = TF.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True, enable_gqa=gqa)
    out = _attention.banded_forward(q, k, v, bands, None, gqa)
    close(out, want_out, dtype, rtol=rtol, scale=want_out.abs().max().item(), what="output by bands")
    got = _attention.banded_backward(g, q, k, v, bands, None, gqa)
    want = autograd(lambda a, b, c: TF.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=gqa),
                    [q, k, v], g)
    for name, a, w in zip("qkv", got, want):
        close(a, w, dtype, rtol=8 * rtol, scale=w.abs().max().item(), what=f"grad_{name} by bands")
    monkeypatch.undo()
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    close(whole, want_out, dtype, rtol=rtol, scale=want_out.abs().max().item(), what="the whole matrix's output")


def test_what_is_not_served_answers_none():
    x16 = randn(1, 2, 8, 64, dtype=torch.float16)
    assert _C._attention(randn(1, 2, 8, 32, dtype=torch.float16), *[randn(1, 2, 8, 32, dtype=torch.float16)] * 2,
                         False, 0.1) is None  # head_dim 32
    assert _C._attention(x16.float(), x16.float(), x16.float(), False, 0.1) is None  # float32
    assert _C._attention(x16, x16.bfloat16(), x16, False, 0.1) is None  # mixed dtypes
    assert _C._attention(x16.cpu(), x16.cpu(), x16.cpu(), False, 0.1) is None  # CPU
    assert _C._attention(x16, randn(1, 3, 8, 64, dtype=torch.float16), x16, False, 0.1) is None  # 2 heads by 3
    wide = randn(1, 2, 8, 72, dtype=torch.float16)
    unaligned = wide[..., 1:65]  # rows start 2 bytes past a 16-byte boundary
    assert _C._attention(unaligned, x16, x16, False, 0.1) is None
    out = F.scaled_dot_product_attention(unaligned, x16, x16)  # composed instead
    close(out, reference(unaligned, x16, x16, False), torch.float16, rtol=RTOL[torch.float16], scale=1.0,
          what="composed fallback")


def test_bad_forward_results_are_refused():
    if not sm80():
        pytest.skip("the fused kernels need sm_80")
    q = randn(1, 2, 8, 64, dtype=torch.float16)
    out, lse = _C._attention(q, q, q, False, 0.125)
    with pytest.raises(ValueError, match="lse must have shape"):
        _C._attention_backward(q, q, q, q, out, lse[:, :1], False, 0.125)
    with pytest.raises(TypeError, match="grad_output and output must have query's dtype"):
        _C._attention_backward(q.float(), q, q, q, out, lse, False, 0.125)
    with pytest.raises(ValueError, match="grad_output has shape"):
        _C._attention_backward(q[:, :1], q, q, q, out, lse, False, 0.125)


@pytest.mark.parametrize("dtype", [ampc.float16, ampc.bfloat16], ids=str)
def test_gpt_trains_the_same_on_the_fused_kernels(dtype, monkeypatch):
    """A GPT with 64-wide heads under autocast: losses and gradients with the fused kernels against
    the composed attention (AMPC_FUSED_ATTENTION=0)."""
    if not sm80():
        pytest.skip("the fused kernels need sm_80")

    def run():
        ampc.manual_seed(0)
        model = ampc.models.gpt(vocab_size=64, block_size=96, n_layer=2, n_head=2, n_embd=128).to("cuda")
        rng = np.random.default_rng(0)
        idx, targets = (_C._to_device(rng.integers(0, 64, (3, 96)), 0) for _ in range(2))
        with ampc.autocast("cuda", dtype=dtype):
            _, loss = model(idx, targets)
        loss.backward()
        grads = {n: np.asarray(_C._to_device(p.grad, -1), dtype=np.float64) for n, p in model.named_parameters()}
        return float(np.asarray(_C._to_device(loss.data, -1))), grads

    calls = []
    real = _attention.fused_forward
    monkeypatch.setattr(_attention, "fused_forward", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    fused_loss, fused = run()
    assert len(calls) == 2 and all(c is not None for c in calls), "the fused kernels did not serve the GPT"
    monkeypatch.setattr(_attention, "FUSED", False)  # AMPC_FUSED_ATTENTION=0
    composed_loss, composed = run()
    assert calls[2:] == [None, None]
    assert abs(fused_loss - composed_loss) < 1e-2 * abs(composed_loss)
    for name, want in composed.items():
        np.testing.assert_allclose(fused[name], want, rtol=0.1, atol=0.05 * np.abs(want).max() + 1e-6, err_msg=name)


def test_the_gpt2_demo_says_how_attention_runs(capsys):
    """The GPT-2 table names the attention it was measured with, and the run trains all three rows."""
    from ampc.cli.main import main

    assert main(["demo", "--model", "gpt2", "--device", "cuda", "--batch-size", "1", "--seq-len", "64",
                 "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert ("attention: ampc's fused kernels in AMP" in out) == sm80(), out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows == ["run", "fp32", "AMP bf16", "AMP fp16"]
