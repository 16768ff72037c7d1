"""ampc.optim and fused clipping on the GPU: the GPU steps equal the CPU steps bit for bit,
agree with torch's fused optimizers, skip on found_inf without a host synchronisation, and
GradScaler.unscale_(max_norm=) matches torch's unscale_ + clip_grad_norm_."""

import copy

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import optim
from test_optim import ADAM_CONFIGS, SGD_CONFIGS, assert_same
from test_torch_cpu import step_side_by_side, ulps

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                np.dtype(np.float16): torch.float16, np.dtype(ml_dtypes.bfloat16): torch.bfloat16}


def to_numpy(t):
    """A CUDA tensor's values as NumPy, bfloat16 included (through its bits)."""
    if t.dtype == torch.bfloat16:
        return t.detach().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return t.detach().cpu().numpy()


def to_torch(a):
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    return torch.from_numpy(np.array(a, order="C")).cuda()  # (ascontiguousarray would make 0-d 1-d)


def misaligned(a):
    """The same values in a CUDA tensor that starts one element into its allocation: dense but
    not aligned for vector accesses (the kernels' scalar path)."""
    t = to_torch(np.concatenate([a.ravel()[:1], a.ravel()]))
    return t[1:].view(a.shape)


SIZES = [(1,), (7,), (16383,), (16385,), (3, 1000), (0,), ()]


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES), ids=lambda d: d.name)
@pytest.mark.parametrize("kind", ["SGD", "Adam"])
@pytest.mark.parametrize("scaled", [False, True])
def test_gpu_steps_equal_cpu_steps(rng, dtype, kind, scaled):
    """Same data on the CPU (NumPy) and the GPU (torch tensors, aligned and not): the same bits
    after every step, parameters, written-back gradients and state; grad_scale 3 (not a power
    of two) and a skipped step on the GPU device."""
    configs = SGD_CONFIGS if kind == "SGD" else ADAM_CONFIGS
    for config in configs:
        make = (lambda ps: optim.SGD(ps, **config)) if kind == "SGD" else \
            (lambda ps: config["cls"](ps, **{k: v for k, v in config.items() if k != "cls"}))
        values = [rng.standard_normal(s).astype(dtype) for s in SIZES]
        cpu = [optim.Parameter(v.copy()) for v in values]
        gpu = [optim.Parameter(misaligned(v) if i % 2 else to_torch(v)) for i, v in enumerate(values)]
        opt_cpu, opt_gpu = make(cpu), make(gpu)
        for step in range(3):
            for p, q in zip(cpu, gpu):
                p.grad = np.asarray(rng.standard_normal(p.shape) * (3.0 if scaled else 1.0)).astype(dtype)
                q.grad = misaligned(p.grad) if q.data.data_ptr() % 16 else to_torch(p.grad)
            if scaled:
                skip = 1.0 if step == 1 else 0.0
                opt_cpu.grad_scale, opt_cpu.found_inf = np.full((), 3.0, np.float32), \
                    np.full((), skip, np.float32)
                opt_gpu.grad_scale = torch.full((), 3.0, device="cuda")
                opt_gpu.found_inf = torch.full((), skip, device="cuda")
            opt_cpu.step()
            opt_gpu.step()
            # float64 Adam: the GPU's pow() may differ from the CPU's in the last bit (optim_math.h).
            same = assert_same if kind == "SGD" or dtype != np.float64 else \
                (lambda a, b, what: np.testing.assert_allclose(a, b, rtol=1e-14, atol=0, err_msg=what))
            for i, (p, q) in enumerate(zip(cpu, gpu)):
                same(to_numpy(q.data), p.data, f"{config} step {step} param {i}")
                same(to_numpy(q.grad), p.grad, f"{config} step {step} grad {i}")
                for key, value in opt_cpu.state[p].items():
                    if value is not None:
                        same(to_numpy(opt_gpu.state[q][key]), value, f"{config} {key} {i}")


def torch_pair(rng, sizes, dtype=torch.float32):
    values = [torch.randn(s, device="cuda", dtype=dtype) for s in sizes]
    theirs = [torch.nn.Parameter(v.clone()) for v in values]
    ours = [optim.Parameter(v.clone()) for v in values]
    return theirs, ours


def same_bits_as_torch(ours, theirs, what):
    """Against torch's fused kernels, bit for bit: ampc's element math is theirs (kernels/optim_math.h;
    the tests' step counts stay clear of the few where CUDA's powf and the CPU's differ)."""
    ours, theirs = ours.detach().contiguous(), theirs.detach().contiguous()
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, what
    same = ours.view(torch.int32) == theirs.view(torch.int32)
    assert same.all(), f"{what}: {same.double().mean().item():.4%} identical, " \
        f"max relative difference {((ours.double() - theirs.double()).abs() / theirs.double().abs()).max().item():.3g}"


TORCH_FUSED = [
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-2)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("SGD", dict(lr=0.1, maximize=True)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1, amsgrad=True)),
    ("Adam", dict(lr=1e-2, maximize=True, betas=(0.8, 0.99))),
    ("AdamW", dict(lr=1e-2, weight_decay=0.2)),
    ("AdamW", dict(lr=1e-2, amsgrad=True, maximize=True)),
]


@pytest.mark.parametrize("name, config", TORCH_FUSED, ids=lambda x: str(x))
def test_same_as_torch_fused_optimizers(rng, name, config):
    theirs, ours = torch_pair(rng, [(64, 33), (5000,), (16385,), (1,)])
    opt_t = getattr(torch.optim, name)(theirs, fused=True, **config)
    opt_o = getattr(optim, name)(ours, **config)
    step_side_by_side(opt_t, opt_o, theirs, ours)
    for p, q in zip(theirs, ours):
        same_bits_as_torch(q.data, p.data, name)
        for key, value in opt_t.state[p].items():
            if torch.is_tensor(value):
                same_bits_as_torch(opt_o.state[q][key].reshape(value.shape), value, key)


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_same_as_torch_with_grad_scalers(rng, name):
    """torch.amp.GradScaler + torch's fused optimizer against ampc.GradScaler + ampc.optim on the
    same model and data, an inf at iteration 2: the same scales and skips, the same parameters.
    AdamW bit for bit; SGD within an ulp or two: torch's SGD kernel rounds `p - lr * g`
    differently when handed a grad_scale (measured on the H200: neither one rounding nor two for
    about 1 % of the elements) from how it rounds it without one, which ampc matches."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).cuda()
    twin = copy.deepcopy(model)
    kwargs = dict(lr=0.05, momentum=0.9) if name == "SGD" else dict(lr=1e-2)
    opt_t = getattr(torch.optim, name)(model.parameters(), fused=True, **kwargs)
    ours = [optim.Parameter(p.data) for p in twin.parameters()]
    opt_o = getattr(optim, name)(ours, **kwargs)
    st, so = torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=1), \
        ampc.GradScaler("cuda", init_scale=128.0, growth_interval=1)
    for i in range(6):
        x, t = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        for m, opt, scaler in ((model, opt_t, st), (twin, None, so)):
            m.zero_grad()
            scaler.scale(torch.nn.functional.mse_loss(m(x), t)).backward()
            if i == 2:
                m[2].weight.grad[0, 0] = float("inf")
        for p, q in zip(twin.parameters(), ours):
            q.grad = p.grad
        st.step(opt_t)
        so.step(opt_o)
        st.update()
        so.update()
        assert so.get_scale() == st.get_scale()
    assert st.get_scale() == 128.0 * 2**5 * 0.5
    for a, b in zip(model.parameters(), twin.parameters()):
        if name == "SGD":
            assert ulps(b.data, a.data).max() <= 4, ulps(b.data, a.data)
        else:
            same_bits_as_torch(b.data, a.data, name)


@pytest.mark.never_waits
def test_a_scaled_step_never_waits_for_the_gpu():
    s = ampc.GradScaler("cuda", init_scale=2.0, growth_interval=1)
    p = optim.Parameter(torch.zeros(1 << 20, device="cuda"))
    opt = optim.AdamW([p], lr=0.1)
    for _ in range(2):  # state exists from here on
        p.grad = torch.full_like(p.data, 2.0)
        s.scale(torch.ones((), device="cuda"))
        s.step(opt)
        s.update()
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start = torch.cuda.Event()
    start.record()
    s.scale(torch.ones((), device="cuda"))
    s.step(opt)
    s.update()
    opt.zero_grad(set_to_none=False)
    assert not start.query()  # nothing above waited for the sleeping kernel
    assert s.get_scale() == 16.0
    assert float(opt.state[p]["step"]) == 3.0


def test_cupy_parameters():
    cupy = pytest.importorskip("cupy")
    values = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    p, q = optim.Parameter(cupy.asarray(values)), optim.Parameter(values.copy())
    opts = optim.Adam([p], lr=0.1, amsgrad=True), optim.Adam([q], lr=0.1, amsgrad=True)
    for _ in range(3):
        q.grad = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
        p.grad = cupy.asarray(q.grad)
        for o in opts:
            o.step()
    assert isinstance(opts[0].state[p]["exp_avg"], cupy.ndarray)
    assert_same(cupy.asnumpy(p.data), q.data)


def test_gpu_bad_input():
    a = optim.Parameter(torch.zeros(3, device="cuda"))
    b = optim.Parameter(torch.zeros(3))
    a.grad, b.grad = torch.ones(3, device="cuda"), torch.ones(3)
    with pytest.raises(ValueError, match="all parameters of one step must be on one device"):
        optim.SGD([a, b], lr=0.1).step()
    assert not a.data.any() and not b.data.any()
    opt = optim.SGD([a], lr=0.1)
    opt.found_inf = torch.zeros((), device="cuda", dtype=torch.float64)
    with pytest.raises(ValueError, match="found_inf must be a one-element float32 array on cuda:0"):
        opt.step()
    opt.found_inf = torch.ones(())  # on the CPU: copied over, as torch's fused optimizers do; skips
    opt.step()
    assert not a.data.any()
    a.grad = torch.ones(3, device="cuda", dtype=torch.float16)
    del opt.found_inf
    with pytest.raises(TypeError, match="has dtype float16 but its parameter has float32"):
        opt.step()
    assert not a.data.any()


@pytest.mark.slow
def test_more_than_2_31_elements():
    n = 2**31 + 17
    p = optim.Parameter(torch.ones(n, device="cuda", dtype=torch.bfloat16))
    p.grad = torch.full_like(p.data, 2.0)
    p.grad[-3:] = torch.tensor([4.0, 8.0, 16.0], dtype=torch.bfloat16)
    opt = optim.SGD([p], lr=0.125, momentum=0.5)
    opt.step()
    opt.step()
    # buffer g, then 0.5 g + g = 1.5 g: p = 1 - 0.125 g - 0.125 * 1.5 g = 1 - 0.3125 g
    expected = torch.tensor([1 - 0.3125 * g for g in (2.0, 4.0, 8.0, 16.0)], dtype=torch.bfloat16)
    assert torch.equal(p.data[[0, -3, -2, -1]].cpu(), expected)
    assert torch.equal(p.data[2**31 - 2: 2**31 + 2].cpu(), expected[:1].repeat(4))
    del p, opt


# ---------------------------------------------------------------------------
# Fused clipping
# ---------------------------------------------------------------------------


def clip_case(seed, dtypes=(torch.float32,), layouts=("contiguous",)):
    """The same scaled gradients (x 512) twice over: for torch's recipe and for ampc."""
    torch.manual_seed(seed)
    shapes = [(64, 33), (5000,), (16385,), (7,), (40, 30)]
    theirs, ours = [], []
    for i, shape in enumerate(shapes):
        dtype = dtypes[i % len(dtypes)]
        layout = layouts[i % len(layouts)] if len(shape) == 2 else "contiguous"
        g = torch.randn(shape, device="cuda", dtype=dtype) * 512
        for group in (theirs, ours):
            p = torch.nn.Parameter(torch.zeros_like(g))
            if layout == "transposed":
                p.grad = g.t().contiguous().t()
            elif layout == "sliced":
                wide = torch.zeros(shape[0], 2 * shape[1], device="cuda", dtype=dtype)
                wide[:, ::2] = g
                p.grad = wide[:, ::2]
            else:
                p.grad = g.clone()
            group.append(p)
    return theirs, ours


def reference_norm(grads, norm_type):
    flat = torch.cat([g.double().flatten() for g in grads]).abs()
    if norm_type == float("inf"):
        return flat.max().item()
    return (flat**norm_type).sum().item() ** (1 / norm_type)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), 3.0])
@pytest.mark.parametrize("dtypes, layouts", [((torch.float32,), ("contiguous",)),
                                             ((torch.float32, torch.bfloat16, torch.float64),
                                              ("contiguous", "transposed", "sliced"))], ids=["fp32", "mixed"])
def test_fused_clipping(norm_type, dtypes, layouts):
    """The norm of the unscaled gradients (float64 reference), the gradients times
    inv_scale * min(1, max_norm / (norm + 1e-6)) rounded once, layouts kept; and, in
    float32, torch's unscale_ + clip_grad_norm_(foreach=True) within its roundings (torch's
    unscale_ refuses bfloat16 gradients on the GPU: "not implemented for 'BFloat16'")."""
    theirs, ours = clip_case(0, dtypes, layouts)
    scaled = [q.grad.clone() for q in ours]
    norm_ref = reference_norm([g.double() / 512 for g in scaled], norm_type)
    opt_t, opt_o = torch.optim.SGD(theirs, lr=0.0), torch.optim.SGD(ours, lr=0.0)
    st, so = torch.amp.GradScaler("cuda", init_scale=512.0), ampc.GradScaler("cuda", init_scale=512.0)
    for s in (st, so):
        s.scale(torch.ones((), device="cuda"))
    if dtypes == (torch.float32,):
        st.unscale_(opt_t)
        expected = torch.nn.utils.clip_grad_norm_(theirs, 5.0, norm_type=norm_type, foreach=True)
    norm = so.unscale_(opt_o, max_norm=5.0, norm_type=norm_type)
    assert torch.is_tensor(norm) and norm.device.type == "cuda" and norm.dtype == torch.float32 and norm.dim() == 0
    assert norm.item() == pytest.approx(norm_ref, rel=1e-6)
    coef = min(1.0, 5.0 / (norm_ref + 1e-6))
    for g, p, q in zip(scaled, theirs, ours):
        assert q.grad.stride() == p.grad.stride()
        tol = 8e-3 if g.dtype == torch.bfloat16 else 4e-7
        torch.testing.assert_close(q.grad.double(), g.double() / 512 * coef, rtol=tol, atol=1e-30)
        if dtypes == (torch.float32,):  # torch's norm is summed in float32: its coefficient differs a little
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-9)
    if dtypes == (torch.float32,):
        torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
    assert float(so._found_inf_per_device(opt_o)["cuda:0"]) == 0.0


@pytest.mark.never_waits
def test_fused_clipping_with_an_inf_skips_and_never_waits():
    theirs, ours = clip_case(1)
    ours[2].grad[100] = float("inf")
    opt = torch.optim.SGD(ours, lr=1.0)
    s = ampc.GradScaler("cuda", init_scale=512.0)
    s.scale(torch.ones((), device="cuda"))
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start = torch.cuda.Event()
    start.record()
    norm = s.unscale_(opt, max_norm=1.0)
    assert not start.query()
    assert not torch.isfinite(norm).item()
    assert s.step(opt, return_found_inf=True)[1] is True
    assert all(not p.data.any() for p in ours)  # skipped


@pytest.mark.never_waits
@pytest.mark.parametrize("which", ["torch", "ampc"])
def test_deferred_clipping(which):
    """unscale_(max_norm=, defer=True) with a fused AdamW (torch's or ampc's): the gradients
    are only read, nothing waits, and the step divides by scale / coefficient, so it writes
    back the unscaled, clipped gradients (within one division's rounding of the float64 value)
    and the parameters follow torch's recipe (unscale_, clip_grad_norm_, fused AdamW)."""
    theirs, ours = clip_case(3)
    scaled = [q.grad.clone() for q in ours]
    if which == "torch":
        opt_o = torch.optim.AdamW(ours, lr=1e-2, fused=True)
    else:
        wrapped = [optim.Parameter(q.data) for q in ours]
        for p, q in zip(wrapped, ours):
            p.grad = q.grad
        ours = wrapped
        opt_o = optim.AdamW(ours, lr=1e-2)
    opt_t = torch.optim.AdamW(theirs, lr=1e-2, fused=True)
    st, so = torch.amp.GradScaler("cuda", init_scale=512.0), ampc.GradScaler("cuda", init_scale=512.0)
    for s in (st, so):
        s.scale(torch.ones((), device="cuda"))
    st.unscale_(opt_t)
    expected_norm = torch.nn.utils.clip_grad_norm_(theirs, 5.0, foreach=True)
    st.step(opt_t)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)
    start = torch.cuda.Event()
    start.record()
    norm = so.unscale_(opt_o, max_norm=5.0, defer=True)
    # Compared on the device, between unscale_ and step, without waiting.
    still_scaled = torch.stack([(p.grad == g).all() for p, g in zip(ours, scaled)]).all()
    so.step(opt_o)
    so.update()
    assert not start.query()
    assert still_scaled.item()
    norm_ref = reference_norm([g.double() / 512 for g in scaled], 2.0)
    assert norm.item() == pytest.approx(norm_ref, rel=1e-6)
    torch.testing.assert_close(norm, expected_norm, rtol=1e-5, atol=0)
    coef = 5.0 / (norm_ref + 1e-6)
    assert coef < 0.1
    for g, q in zip(scaled, ours):
        torch.testing.assert_close(q.grad.double(), g.double() / 512 * coef, rtol=1.5e-7, atol=0)
    for p, q in zip(theirs, ours):
        torch.testing.assert_close(q.data, p.data, rtol=1e-5, atol=1e-7)


def test_fused_clipping_on_a_disabled_scaler_clips():
    theirs, ours = clip_case(2)
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    norm = ampc.GradScaler("cuda", enabled=False).unscale_(torch.optim.SGD(ours, lr=1.0), max_norm=0.5)
    torch.testing.assert_close(norm, expected, rtol=1e-5, atol=0)
    for p, q in zip(theirs, ours):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-8)


def test_a_gpu_scaler_steps_cpu_parameters():
    """The scale and the inf flag live on the GPU, the parameters on the CPU: copied over (which
    waits, as torch's fused optimizers' .to(device) does)."""
    p = optim.Parameter(np.ones(4, np.float32))
    opt = optim.SGD([p], lr=0.25)
    s = ampc.GradScaler("cuda", init_scale=4.0)
    for bad in (False, True, False):
        p.grad = np.full(4, 8.0, np.float32)
        if bad:
            p.grad[1] = np.inf
        s.scale(torch.ones((), device="cuda"))
        s.step(opt)
        s.update()
    # Clean steps at scale 4 (gradient 8 / 4 = 2) and, after the backoff, at scale 2 (8 / 2 = 4).
    np.testing.assert_array_equal(p.data, np.float32(1.0 - 0.25 * 2 - 0.25 * 4))


def test_steps_are_ordered_with_torchs_current_stream():
    """Gradients written on a torch side stream behind a long kernel: the step waits for them
    (through the stream torch reports with each tensor), and torch's later work on that stream
    sees the updated parameters."""
    p = optim.Parameter(torch.ones(1 << 20, device="cuda"))
    opt = optim.SGD([p], lr=0.5, momentum=0.9)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        p.grad = torch.full_like(p.data, 2.0)  # written after the sleep, on the side stream
        opt.step()
        after = p.data.clone()  # on the side stream again: after ampc's kernel
        opt.zero_grad(set_to_none=False)
        grad_after = p.grad.clone()
    side.synchronize()
    assert torch.equal(after, torch.zeros_like(after))  # 1 - 0.5 * 2
    assert not grad_after.any()
