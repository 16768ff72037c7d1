"""Side by side with torch on the CPU, where torch is installed: ampc.GradScaler against
torch.amp.GradScaler("cpu") with torch's optimizers (the same scales, skips and parameters, bit
for bit), and ampc.optim against torch.optim (torch's CPU kernels round in float32 where ampc
rounds once from float64, so within a few ulps)."""

import copy

import numpy as np
import pytest

import ampc
from ampc import optim

torch = pytest.importorskip("torch")

SKIP_ITER = 2


def train(model, opt, scaler, data):
    for i, (x, t) in enumerate(data):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), t)
        scaler.scale(loss).backward()
        if i == SKIP_ITER:
            model[1].weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
    return scaler.get_scale()


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9),
                                  lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True)],
                         ids=["SGD-momentum", "AdamW-fused"])
def test_same_as_torch_grad_scaler(make):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    twin = copy.deepcopy(model)
    data = [(torch.randn(8, 8), torch.randn(8, 8)) for _ in range(5)]
    opt, twin_opt = make(model.parameters()), make(twin.parameters())
    theirs = train(model, opt, torch.amp.GradScaler("cpu", init_scale=128.0, growth_interval=1), data)
    ours = train(twin, twin_opt, ampc.GradScaler("cpu", init_scale=128.0, growth_interval=1), data)
    assert ours == theirs == 128.0 * 2**4 * 0.5
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def ulps(a, b):
    """Distance in float32 units in the last place, per element."""
    def ordered(t):
        i = t.view(torch.int32).long()
        return torch.where(i < 0, -(i & 0x7FFFFFFF), i)
    return (ordered(a) - ordered(b)).abs()


def step_side_by_side(opt_t, opt_o, theirs, ours, steps=5):
    """Steps of torch's optimizer and ampc's on the same fresh random gradients."""
    for _ in range(steps):
        for p, q in zip(theirs, ours):
            p.grad = torch.randn_like(p)
            q.grad = p.grad.clone()
        opt_t.step()
        opt_o.step()


@pytest.mark.parametrize("name, config", [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=1e-2, amsgrad=True)),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
], ids=lambda x: str(x))
def test_close_to_torch_optimizers(name, config):
    torch.manual_seed(1)
    values = [torch.randn(s) for s in [(64, 33), (5000,)]]
    theirs = [torch.nn.Parameter(v.clone()) for v in values]
    ours = [optim.Parameter(v.clone()) for v in values]
    opt_t = getattr(torch.optim, name)(theirs, **config)
    opt_o = getattr(optim, name)(ours, **config)
    step_side_by_side(opt_t, opt_o, theirs, ours)
    for p, q in zip(theirs, ours):
        assert isinstance(q.data, torch.Tensor)
        d = ulps(p.detach(), q.data)
        if name == "SGD":
            # torch's CPU SGD rounds as its fused CUDA kernel does, and so as ampc does.
            assert (d == 0).all()
        else:
            # torch's CPU Adam takes a lerp for the first moment and float64 bias corrections
            # where its CUDA kernel (and ampc) take fmas and float32: measured after 5 steps,
            # 26-42 % identical, the median 1 ulp apart, at most 1.2e-6.
            assert d.double().median() <= 2
        torch.testing.assert_close(q.data, p.detach(), rtol=1e-5, atol=2e-6)
    for key, value in opt_t.state[theirs[0]].items():
        if key != "step":
            torch.testing.assert_close(opt_o.state[ours[0]][key], value, rtol=1e-5, atol=1e-6)
    if "Adam" in name:
        assert float(opt_o.state[ours[0]]["step"]) == float(opt_t.state[theirs[0]]["step"]) == 5


def test_state_dicts_move_between_torch_and_ampc():
    torch.manual_seed(2)
    values = [torch.randn(7), torch.randn(3, 3)]
    theirs = [torch.nn.Parameter(v.clone()) for v in values]
    ours = [optim.Parameter(v.clone()) for v in values]
    opt_t, opt_o = torch.optim.AdamW(theirs, lr=1e-2), optim.AdamW(ours, lr=1e-2)
    for p, q in zip(theirs, ours):
        p.grad = torch.randn_like(p)
        q.grad = p.grad.clone()
    opt_t.step()
    opt_o.load_state_dict(opt_t.state_dict())
    for p, q in zip(theirs, ours):
        assert torch.equal(opt_o.state[q]["exp_avg"], opt_t.state[p]["exp_avg"])
    back = torch.optim.AdamW([torch.nn.Parameter(v.clone()) for v in values], lr=1e-2)
    back.load_state_dict(opt_o.state_dict())
    assert float(back.state[back.param_groups[0]["params"][0]]["step"]) == 1.0
    assert back.param_groups[0]["lr"] == 1e-2 and back.param_groups[0]["weight_decay"] == 1e-2


def test_numpy_and_torch_parameters_step_alike():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(100).astype(np.float32)
    g = rng.standard_normal(100).astype(np.float32)
    p, q = optim.Parameter(a.copy()), optim.Parameter(torch.from_numpy(a.copy()))
    p.grad, q.grad = g.copy(), torch.from_numpy(g.copy())
    for o in (optim.Adam([p], lr=0.1), optim.Adam([q], lr=0.1)):
        o.step()
    assert np.array_equal(p.data, q.data.numpy())


# Where ampc's constructors differ from torch.nn's on purpose: private arguments, and the bias
# switch newer torch adds to its norms (their bias is always there in ampc, as in torch by default).
_NOT_TAKEN = {"Embedding": {"_weight", "_freeze"}, "BatchNorm1d": {"bias"}, "BatchNorm2d": {"bias"},
              "GroupNorm": {"bias"}}


def test_module_constructors_take_torch_s_arguments_and_defaults():
    import inspect

    from ampc import nn

    checked = 0
    for name in nn.__all__:
        theirs = getattr(torch.nn, name, None)
        if theirs is None or not isinstance(theirs, type) or name in ("Module", "Parameter", "Sequential"):
            continue
        ours = getattr(nn, name)
        want = {k: p.default for k, p in inspect.signature(theirs.__init__).parameters.items()
                if k not in ("self", "args", "kwargs", "device", "dtype") and k not in _NOT_TAKEN.get(name, ())}
        got = {k: p.default for k, p in inspect.signature(ours.__init__).parameters.items() if k != "self"}
        assert list(got) == list(want) and all(repr(got[k]) == repr(want[k]) for k in want), name
        checked += 1
    assert checked >= 29


def test_the_demo_adds_torch_s_rows(capsys):
    """`python -m ampc demo --compare-torch` on the CPU: torch's three runs of the same MLP and recipe
    after ampc's, each trained (better than chance on the held-out digits), fp16 with torch's scaler."""
    from ampc.cli.main import main

    assert main(["demo", "--epochs", "1", "--compare-torch"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and "---" not in line]
    assert [row[0].strip() for row in rows] == ["run", "fp32", "AMP bf16", "AMP fp16",
                                               "torch fp32", "torch AMP bf16", "torch AMP fp16"]
    for row in rows[4:]:
        assert float(row[5].strip().rstrip(" %")) > 50
    assert [row[7].strip() for row in rows[4:]] == ["—", "—", "65536"]


def test_indexing_torch_data_by_index_arrays_is_refused_on_the_tape():
    """Only NumPy data's gradient adds up at index arrays here: other libraries' backward is refused
    with a clear error, not given a zero gradient (the forward reads as torch reads it)."""
    w = ampc.nn.Parameter(torch.ones(4, 3))
    assert tuple(w[1:3].data.shape) == (2, 3)
    picked = w[torch.tensor([0, 0])]
    assert tuple(picked.data.shape) == (2, 3)
    with pytest.raises(NotImplementedError, match="indexing by index arrays or masks is implemented for NumPy"):
        ampc.nn.functional.sum(picked).backward()
    assert w.grad is None


def test_argmax_of_torch_data_is_torch_s():
    """Tensor.argmax/argmin on torch data: torch's own, with its dim and keepdim."""
    w = ampc.nn.Parameter(torch.randn(5, 7, dtype=torch.float64))
    logits = ampc.nn.functional.linear(torch.randn(6, 7, dtype=torch.float64), w)
    values = logits.data
    assert torch.equal(logits.argmax(1), values.argmax(1))
    assert torch.equal(logits.argmin(dim=0, keepdim=True), values.argmin(dim=0, keepdim=True))
    assert int(logits.argmax()) == int(values.argmax())


class _NanoGPT(torch.nn.Module):
    """nanoGPT's GPT-2 (Karpathy's model.py, dropout left out) in torch: the reference
    ampc.models.gpt claims to be, written here independently of it."""

    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        nn = torch.nn
        self.n_head = n_head
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(nn.ModuleDict(dict(
            ln_1=nn.LayerNorm(n_embd), c_attn=nn.Linear(n_embd, 3 * n_embd), attn_proj=nn.Linear(n_embd, n_embd),
            ln_2=nn.LayerNorm(n_embd), c_fc=nn.Linear(n_embd, 4 * n_embd), mlp_proj=nn.Linear(4 * n_embd, n_embd)))
            for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def ampc_state_dict(self):
        """The state dict under ampc.models.gpt's (and nanoGPT's) names."""
        rename = {"attn_proj": "attn.c_proj", "c_attn": "attn.c_attn", "c_fc": "mlp.c_fc", "mlp_proj": "mlp.c_proj"}
        out = {}
        for key, value in self.state_dict().items():
            parts = key.split(".")
            if parts[0] == "h":
                parts[2] = rename.get(parts[2], parts[2])
            out[".".join(parts)] = value.detach().numpy()
        return out

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.h:
            q, k, v = blk.c_attn(blk.ln_1(x)).split(x.shape[2], dim=2)
            q, k, v = (z.view(b, t, self.n_head, -1).transpose(1, 2) for z in (q, k, v))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk.attn_proj(y.transpose(1, 2).contiguous().view(b, t, -1))
            x = x + blk.mlp_proj(torch.nn.functional.gelu(blk.c_fc(blk.ln_2(x)), approximate="tanh"))
        logits = self.lm_head(self.ln_f(x))
        return torch.nn.functional.cross_entropy(logits.view(b * t, -1), targets.view(-1))


@pytest.mark.parametrize("dtype, rtol", [(None, 2e-6), ("bfloat16", 2e-2), ("float16", 3e-3)],
                         ids=["fp32", "autocast bf16", "autocast fp16"])
def test_gpt_trains_as_nanogpt_in_torch(dtype, rtol):
    """ampc.models.gpt and nanoGPT's model in torch with the same weights and batch: the same loss,
    and every parameter's gradient (the tied embedding's from both its uses) within float32's
    rounding, or bfloat16's and float16's under each library's CPU autocast."""
    cfg = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32)
    torch.manual_seed(0)
    ref = _NanoGPT(**cfg)
    model = ampc.models.gpt(**cfg)
    model.load_state_dict(ref.ampc_state_dict())
    rng = np.random.default_rng(5)
    idx, targets = rng.integers(0, 97, (3, 16)), rng.integers(0, 97, (3, 16))
    with torch.autocast("cpu", dtype=getattr(torch, dtype or "float32"), enabled=dtype is not None):
        want = ref(torch.tensor(idx), torch.tensor(targets))
    with ampc.autocast("cpu", dtype=getattr(ampc, dtype or "float32"), enabled=dtype is not None):
        _, loss = model(idx, targets)
    want.backward()
    loss.backward()
    assert float(loss) == pytest.approx(want.item(), rel=rtol / 10)
    grads = {k: v.grad.numpy() for k, v in ref.named_parameters()}
    rename = dict(zip(ref.state_dict(), ref.ampc_state_dict()))
    params = dict(model.named_parameters())
    assert len(params) == len(grads)
    for key, want_grad in grads.items():
        got = params[rename[key]].grad
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want_grad, rtol=0, atol=rtol * np.abs(want_grad).max(), err_msg=key)


def test_numpy_parameters_fed_torch_data_get_numpy_gradients():
    """A model of NumPy parameters fed torch tensors: the output is torch's, as the data's library,
    but each .grad is a NumPy array like its parameter (it was a torch.Tensor), equal to the
    gradient the same batch as NumPy arrays gives."""
    nn = ampc.nn
    ampc.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5)
    out = model(torch.from_numpy(x))
    assert isinstance(out.data, torch.Tensor)
    nn.functional.cross_entropy(out, torch.from_numpy(y)).backward()
    from_torch = [p.grad for p in model.parameters()]
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    for got, want in zip(from_torch, (p.grad for p in model.parameters())):
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want)


# torch 2.11 warns that its invariant checks are "implicitly disabled" even for a tensor made with
# check_invariants=True; the suite turns warnings into errors.
@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
def test_sparse_gradients_are_unscaled_as_torch_unscales_them():
    """torch unscales a sparse COO gradient's values; a float16 one is coalesced first where float16
    is allowed, so an overflow of its duplicates' sum is seen."""
    for scaler in (ampc.GradScaler("cpu", init_scale=4.0), torch.amp.GradScaler("cpu", init_scale=4.0)):
        scaler.scale(torch.ones(()))
        p = torch.nn.Parameter(torch.zeros(4))
        p.grad = torch.sparse_coo_tensor([[0, 2, 0]], torch.tensor([8.0, 4.0, 12.0]), (4,), check_invariants=True)
        scaler.unscale_(torch.optim.SGD([p], lr=1.0))
        assert p.grad._values().tolist() == [2.0, 1.0, 3.0]
        h = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
        h.grad = torch.sparse_coo_tensor([[1, 1]], torch.tensor([40000.0, 40000.0], dtype=torch.float16), (4,),
                                         check_invariants=True)
        found = scaler._check_inf_per_device(torch.optim.SGD([h], lr=1.0))
        assert float(next(iter(found.values()))) == 1.0
        assert h.grad.is_coalesced() and torch.isinf(h.grad._values()).all()
