"""ampc.GradScaler on the GPU: side by side with torch's GradScaler on the same
model and data (same scales, same skip decisions, bit-identical parameters),
with torch optimizers (plain and fused), CuPy gradients, huge gradients, and
gradients on the CPU and the GPU at once."""

import copy
import pickle

import numpy as np
import pytest

import ampc

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

SKIP_ITER = 2


def make_case(seed=0, optimizer="sgd"):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)).cuda()
    twin = copy.deepcopy(model)
    data = [(torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")) for _ in range(4)]

    def opt(m):
        if optimizer == "sgd":
            return torch.optim.SGD(m.parameters(), lr=1.0, momentum=0.9)
        return torch.optim.AdamW(m.parameters(), lr=1e-2, fused=True)

    return model, opt(model), twin, opt(twin), data


def train(model, opt, scaler, data, clip=None):
    for i, (x, t) in enumerate(data):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), t)
        scaler.scale(loss).backward()
        if i == SKIP_ITER:
            model[1].weight.grad.fill_(float("inf"))
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip, error_if_nonfinite=False)
        scaler.step(opt)
        scaler.update()
    return scaler.get_scale()


@pytest.mark.parametrize("optimizer", ["sgd", "fused_adamw"])
@pytest.mark.parametrize("clip", [None, 0.2])
def test_same_as_torch(optimizer, clip):
    if optimizer == "fused_adamw" and clip is not None:
        pytest.skip("clipping after unscale_ with a fused optimizer: covered by sgd")
    model, opt, twin, twin_opt, data = make_case(optimizer=optimizer)
    theirs = train(model, opt, torch.amp.GradScaler("cuda", init_scale=128.0, growth_interval=1), data, clip)
    ours = train(twin, twin_opt, ampc.GradScaler("cuda", init_scale=128.0, growth_interval=1), data, clip)
    assert ours == theirs == 128.0 * 2**3 * 0.5
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(opt.state.values(), twin_opt.state.values()):
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_scale_keeps_the_graph():
    s = ampc.GradScaler("cuda", init_scale=4.0)
    w = torch.ones(3, device="cuda", requires_grad=True)
    loss = (w * 2).sum().half()
    scaled = s.scale(loss)
    assert scaled.dtype == torch.float32 and scaled.requires_grad  # 0-d fp16 * fp32 scale, as torch
    scaled.backward()
    assert torch.equal(w.grad, torch.full((3,), 8.0, device="cuda"))
    assert s.scale(torch.ones(2, dtype=torch.float16, device="cuda")).dtype == torch.float16


class Misplaced:
    """A producer whose __dlpack_device__ names one device while its capsule holds memory on the other."""

    def __init__(self, tensor, device):
        self.tensor, self.device = tensor, device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        kwargs.pop("stream", None)  # asked for the claimed device's stream
        return self.tensor.__dlpack__(**kwargs)


@pytest.mark.parametrize("memory,claimed", [("cuda", (1, 0)), ("cpu", (2, 0))], ids=["gpu memory", "host memory"])
def test_scale_refuses_a_producer_whose_device_and_memory_disagree(memory, claimed):
    """Before: scale() ran the claimed device's kernel on the other's memory: the CPU loop read GPU
    memory (a segmentation fault), a GPU kernel host memory."""
    s = ampc.GradScaler("cpu" if claimed[0] == 1 else "cuda", init_scale=4.0)
    with pytest.raises(BufferError, match="__dlpack_device__\\(\\) says"):
        s.scale(Misplaced(torch.full((), 2.0, device=memory), claimed))
    loss = torch.full((), 2.0, device="cpu" if claimed[0] == 1 else "cuda")
    assert float(torch.from_dlpack(s.scale(Misplaced(loss, claimed)))) == 8.0  # an honest one still scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_unscale(dtype, layout, bad):
    s = ampc.GradScaler("cuda", init_scale=4.0)
    s.scale(torch.ones((), device="cuda"))
    params = [torch.nn.Parameter(torch.zeros(20, 20, device="cuda", dtype=dtype)) for _ in range(2)]
    for p in params:
        p.grad = torch.full((20, 20), 4.0, device="cuda", dtype=dtype)
        if layout == "transposed":
            p.grad = p.grad.t()
        elif layout == "sliced":
            p.grad = torch.full((20, 40), 4.0, device="cuda", dtype=dtype)[:, :20]
    if bad is not None:
        params[1].grad[2, 2] = bad
    opt = torch.optim.SGD(params, lr=1.0)
    s.unscale_(opt)
    found = s._found_inf_per_device(opt)
    assert list(found) == ["cuda:0"] and isinstance(found["cuda:0"], torch.Tensor)
    assert float(found["cuda:0"]) == (0.0 if bad is None else 1.0)
    g = params[0].grad
    assert torch.equal(g, torch.ones_like(g))


def test_fp16_grads_are_refused_like_torch():
    s = ampc.GradScaler("cuda")
    s.scale(torch.ones((), device="cuda"))
    p = torch.nn.Parameter(torch.zeros(4, device="cuda", dtype=torch.float16))
    p.grad = torch.ones(4, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        s.unscale_(torch.optim.SGD([p], lr=1.0))


def test_ten_thousand_gradients():
    s = ampc.GradScaler("cuda", init_scale=2.0)
    s.scale(torch.ones((), device="cuda"))
    sizes = torch.randint(1, 5000, (10_000,)).tolist()
    params = [torch.nn.Parameter(torch.zeros(n, device="cuda")) for n in sizes]
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    params[7777].grad[-1] = float("inf")
    opt = torch.optim.SGD(params, lr=1.0)
    assert s.step(opt, return_found_inf=True)[1] is True
    assert all(torch.equal(p, torch.zeros_like(p)) for p in params[:50])  # skipped
    assert torch.equal(params[9999].grad, torch.ones_like(params[9999]))  # unscaled, in the last launch


def test_more_than_2_31_elements():
    s = ampc.GradScaler("cuda", init_scale=4.0)
    s.scale(torch.ones((), device="cuda"))
    p = torch.nn.Parameter(torch.zeros(2**31 + 17, device="cuda", dtype=torch.bfloat16))
    p.grad = torch.full_like(p, 4.0)
    opt = torch.optim.SGD([p], lr=1.0)
    s.unscale_(opt)
    assert float(s._found_inf_per_device(opt)["cuda:0"]) == 0.0
    assert torch.equal(p.grad[-1000:], torch.ones(1000, device="cuda", dtype=torch.bfloat16))
    del opt
    s.update()
    p.grad[-1] = float("inf")
    s.unscale_(opt := torch.optim.SGD([p], lr=1.0))
    assert float(s._found_inf_per_device(opt)["cuda:0"]) == 1.0
    del p, opt


def test_cupy_gradients():
    cupy = pytest.importorskip("cupy")

    class Param:
        def __init__(self, g):
            self.grad = g

    class Opt:
        def __init__(self, params):
            self.param_groups = [{"params": params}]
            self.steps = 0

        def step(self):
            self.steps += 1

    s = ampc.GradScaler("cuda", init_scale=8.0)
    assert float(s.scale(cupy.float32(2.0) * cupy.ones(()))) == 16.0
    grads = [cupy.full(1000, 8.0, cupy.float32), cupy.full((30, 40), 8.0, cupy.float32)[:, ::3]]
    opt = Opt([Param(g) for g in grads])
    s.step(opt)
    assert opt.steps == 1 and all(bool((g == 1.0).all()) for g in grads)
    s.update()
    grads[0][5] = cupy.nan
    s.scale(cupy.ones(()))
    s.step(opt)
    assert opt.steps == 1
    report = s.overflow_report(opt)
    assert [(r["name"], r["nonfinite"], r["device"]) for r in report] == [("param_groups[0]['params'][0]", 1, "cuda:0")]


def test_cpu_and_gpu_gradients_together():
    s = ampc.GradScaler("cuda", init_scale=4.0)
    s.scale(torch.ones((), device="cuda"))
    a = torch.nn.Parameter(torch.zeros(3, device="cuda"))
    b = torch.nn.Parameter(torch.zeros(3))
    a.grad = torch.full((3,), 4.0, device="cuda")
    b.grad = torch.full((3,), 4.0)
    opt = torch.optim.SGD([a, b], lr=1.0)
    s.unscale_(opt)
    assert sorted(s._found_inf_per_device(opt)) == ["cpu", "cuda:0"]
    assert torch.equal(a.grad.cpu(), torch.ones(3)) and torch.equal(b.grad, torch.ones(3))
    s.step(opt)
    s.update()
    b.grad[0] = float("inf")
    s.scale(torch.ones((), device="cuda"))
    s.step(opt)
    s.update()
    assert s.get_scale() == 2.0  # the CPU's inf backed the GPU's scale off


def test_state_dict_and_pickle_on_the_gpu():
    s = ampc.GradScaler("cuda", init_scale=3.0, growth_factor=4.0, growth_interval=2)
    s.scale(torch.ones((), device="cuda"))
    ref = torch.amp.GradScaler("cuda", init_scale=3.0, growth_factor=4.0, growth_interval=2)
    assert s.state_dict() == ref.state_dict()
    t = torch.amp.GradScaler("cuda")
    t.load_state_dict(s.state_dict())
    assert t.get_scale() == 3.0
    u = pickle.loads(pickle.dumps(s))
    assert u.get_scale() == 3.0 and float(u.scale(torch.full((), 2.0, device="cuda"))) == 6.0


@pytest.mark.never_waits
def test_no_host_sync_until_step_decides():
    """unscale_ and update queue work; get_scale waits. A blocking kernel queued first proves
    nothing waited for it in between."""
    s = ampc.GradScaler("cuda", init_scale=2.0, growth_interval=1)
    s.scale(torch.ones((), device="cuda"))  # creates the scale (a copy from the host) before the test
    p = torch.nn.Parameter(torch.zeros(1 << 20, device="cuda"))
    p.grad = torch.full_like(p, 2.0)
    opt = torch.optim.SGD([p], lr=1.0)
    torch.cuda.synchronize()
    torch.cuda._sleep(50_000_000)  # tens of milliseconds of GPU work
    start = torch.cuda.Event()
    start.record()
    s.scale(torch.ones((), device="cuda"))
    s.unscale_(opt)
    assert not start.query()  # still behind the sleep: neither call waited for the GPU
    s.step(opt)  # decides: waits
    s.update()
    assert s.get_scale() == 4.0
