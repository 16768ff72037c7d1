"""ampc.optim on the CPU: every step against optim_reference.py bit for bit (torch's fused
arithmetic) and against the float64 algorithm, the GradScaler contract (grad_scale divides,
found_inf skips without changing anything), torch's defaults, texts and state-dict layout."""

import copy
import pickle

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import _C, optim
from optim_reference import adam_step_exact, adam_step_f64, sgd_step_exact, sgd_step_f64

DTYPES = [np.float32, np.float64, np.float16, ml_dtypes.bfloat16]
# Sizes that cross the CPU kernel's 2^15-element blocks and leave odd tails.
SIZES = [(1,), (7,), (33, 3), (), (0,), (2**15 + 5,), (3, 1000)]


def make_params(rng, dtype, sizes=SIZES):
    return [optim.Parameter(rng.standard_normal(s).astype(dtype)) for s in sizes]


def fresh_grads(rng, params, scale=1.0):
    for p in params:
        p.grad = np.asarray(rng.standard_normal(p.shape) * scale).astype(p.data.dtype)  # 0-d stays an array


def assert_same(actual, expected, what=""):
    """Every element, bit for bit (NaN-free data)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[actual.dtype.itemsize]
    diff = np.flatnonzero(actual.view(bits).ravel() != expected.view(bits).ravel())
    assert diff.size == 0, f"{what}: {diff.size} of {actual.size} differ, first at {diff[:5]}: " \
                           f"{actual.ravel()[diff[:5]]} vs {expected.ravel()[diff[:5]]}"


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-2),
    dict(lr=0.02, momentum=0.5, weight_decay=0.1, maximize=True),
    dict(lr=0.1, weight_decay=0.05, maximize=True),
]

ADAM_CONFIGS = [
    dict(cls=optim.Adam, lr=1e-2),
    dict(cls=optim.Adam, lr=1e-2, weight_decay=0.1, amsgrad=True),
    dict(cls=optim.Adam, lr=3e-3, betas=(0.5, 0.9), eps=1e-6, maximize=True),
    dict(cls=optim.AdamW, lr=1e-2),
    dict(cls=optim.AdamW, lr=1e-2, weight_decay=0.3, amsgrad=True, maximize=True),
]


def adam_kwargs(config):
    kw = {k: v for k, v in config.items() if k not in ("cls", "betas")}
    if "betas" in config:
        kw["beta1"], kw["beta2"] = config["betas"]
    kw.setdefault("weight_decay", 1e-2 if config["cls"] is optim.AdamW else 0.0)
    kw["decoupled"] = config["cls"] is optim.AdamW
    return kw


# ---------------------------------------------------------------------------
# The steps against the references
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("config", SGD_CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_sgd_matches_torch_fused_arithmetic(rng, dtype, config):
    params = make_params(rng, dtype)
    opt = optim.SGD(params, **config)
    expected = [p.data.copy() for p in params]
    bufs = [None] * len(params)
    for step in range(4):
        fresh_grads(rng, params)
        for i, p in enumerate(params):
            expected[i], bufs[i], _ = sgd_step_exact(expected[i], p.grad, bufs[i], step == 0, **config)
        opt.step()
        for i, p in enumerate(params):
            assert_same(p.data, expected[i], f"step {step} param {i}")
            if config.get("momentum"):
                assert_same(opt.state[p]["momentum_buffer"], bufs[i], f"step {step} buffer {i}")
            else:
                assert opt.state[p]["momentum_buffer"] is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("config", ADAM_CONFIGS,
                         ids=lambda c: "-".join([c["cls"].__name__] + [f"{k}={v}" for k, v in c.items() if k != "cls"]))
def test_adam_matches_torch_fused_arithmetic(rng, dtype, config):
    params = make_params(rng, dtype)
    opt = config["cls"](params, **{k: v for k, v in config.items() if k != "cls"})
    kw = adam_kwargs(config)
    expected = [p.data.copy() for p in params]
    states = [{"step": 0.0, "exp_avg": np.zeros_like(p.data), "exp_avg_sq": np.zeros_like(p.data),
               "max_exp_avg_sq": np.zeros_like(p.data)} for p in params]
    for step in range(4):
        fresh_grads(rng, params)
        for i, p in enumerate(params):
            expected[i], new, _ = adam_step_exact(expected[i], p.grad, states[i], **kw)
            states[i].update(new)
        opt.step()
        for i, p in enumerate(params):
            s = opt.state[p]
            assert_same(p.data, expected[i], f"step {step} param {i}")
            assert_same(s["exp_avg"], states[i]["exp_avg"], f"step {step} exp_avg {i}")
            assert_same(s["exp_avg_sq"], states[i]["exp_avg_sq"], f"step {step} exp_avg_sq {i}")
            assert ("max_exp_avg_sq" in s) == bool(config.get("amsgrad"))
            if config.get("amsgrad"):
                assert_same(s["max_exp_avg_sq"], states[i]["max_exp_avg_sq"], f"step {step} vmax {i}")
            assert s["step"].dtype == np.float32 and s["step"].shape == () and float(s["step"]) == step + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_sgd_is_the_algorithm(rng, dtype):
    """Close to torch's documented algorithm run in float64 (catches a formula shared by the
    kernel and the exact reference)."""
    for config in SGD_CONFIGS:
        params = make_params(rng, dtype, [(500,), (3, 7)])
        opt = optim.SGD(params, **config)
        ref = [p.data.astype(np.float64) for p in params]
        bufs = [None] * len(params)
        for step in range(6):
            fresh_grads(rng, params)
            for i, p in enumerate(params):
                ref[i], bufs[i] = sgd_step_f64(ref[i], p.grad, bufs[i], step == 0, **config)
            opt.step()
        tol = 1e-13 if dtype == np.float64 else 2e-6
        for p, r in zip(params, ref):
            np.testing.assert_allclose(p.data, r, rtol=tol, atol=tol, err_msg=str(config))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_adam_is_the_algorithm(rng, dtype):
    for config in ADAM_CONFIGS:
        params = make_params(rng, dtype, [(500,), (3, 7)])
        opt = config["cls"](params, **{k: v for k, v in config.items() if k != "cls"})
        kw = adam_kwargs(config)
        ref = [p.data.astype(np.float64) for p in params]
        states = [{"step": 0, "exp_avg": 0.0, "exp_avg_sq": 0.0, "max_exp_avg_sq": 0.0} for _ in params]
        for _ in range(6):
            fresh_grads(rng, params)
            for i, p in enumerate(params):
                ref[i], new = adam_step_f64(ref[i], p.grad, states[i], **kw)
                states[i].update(new)
            opt.step()
        tol = 1e-12 if dtype == np.float64 else 2e-5
        for p, r in zip(params, ref):
            np.testing.assert_allclose(p.data, r, rtol=tol, atol=tol, err_msg=str(config))


def test_results_do_not_depend_on_the_thread_count(rng):
    sizes = [(2**15 * 3 + 11,), (5,), (2**16,), (2**15 - 1,)]
    base = make_params(rng, np.float32, sizes)
    fresh_grads(rng, base)
    results = []
    previous = ampc.get_num_threads()
    try:
        for threads in (1, 2, 3):
            ampc.set_num_threads(threads)
            params = copy.deepcopy(base)
            opt = optim.AdamW(params, lr=0.1, amsgrad=True)
            opt.step()
            opt.step()
            results.append([p.data for p in params])
    finally:
        ampc.set_num_threads(previous)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert_same(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_instruction_set_gives_the_same_bits(rng, dtype):
    """The portable loops (fma() from libm) and the AVX2 + FMA ones (fma as an instruction),
    for every option the loops specialise on."""
    base = make_params(rng, dtype)
    fresh_grads(rng, base)
    makers = [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1),
              lambda ps: optim.SGD(ps, lr=0.1, maximize=True)] + \
             [lambda ps, c=c: c["cls"](ps, **{k: v for k, v in c.items() if k != "cls"}) for c in ADAM_CONFIGS]
    previous = ampc._C._cpu_isa()
    results = {}
    try:
        for isa in ampc._C._cpu_isas():
            ampc._C._set_cpu_isa(isa)
            results[isa] = []
            for make in makers:
                params = copy.deepcopy(base)
                opt = make(params)
                opt.grad_scale, opt.found_inf = np.full((), 3.0, np.float32), np.zeros((), np.float32)
                opt.step()
                opt.step()
                results[isa].append([p.data for p in params] + [p.grad for p in params])
    finally:
        ampc._C._set_cpu_isa(previous)
    for isa, arrays in results.items():
        for a, b in zip(sum(results["portable"], []), sum(arrays, [])):
            assert_same(b, a, isa)


def test_parameters_without_gradients_are_left_alone(rng):
    params = make_params(rng, np.float32, [(10,), (4,), (6,)])
    before = [p.data.copy() for p in params]
    params[1].grad = rng.standard_normal(4).astype(np.float32)
    for opt in (optim.SGD(params, lr=0.1, momentum=0.9), optim.Adam(params, lr=0.1)):
        opt.step()
        assert set(opt.state) == {params[1]}
    assert_same(params[0].data, before[0])
    assert_same(params[2].data, before[2])
    assert not np.array_equal(params[1].data, before[1])


def test_dense_arrays_in_any_dimension_order(rng):
    """A transposed (Fortran-order) parameter is dense: stepped in memory order, its gradient
    and state laid out like it."""
    data = np.asfortranarray(rng.standard_normal((64, 33)).astype(np.float32))
    p = optim.Parameter(data)
    p.grad = np.asfortranarray(rng.standard_normal((64, 33)).astype(np.float32))
    expected, _, _ = sgd_step_exact(data.copy(), p.grad, None, True, lr=0.5)
    optim.SGD([p], lr=0.5).step()
    assert p.data is data
    assert_same(p.data, expected)
    q = optim.Parameter(data)
    q.grad = p.grad
    opt = optim.Adam([q])
    opt.step()
    assert opt.state[q]["exp_avg"].flags.f_contiguous


# ---------------------------------------------------------------------------
# With a GradScaler: grad_scale and found_inf
# ---------------------------------------------------------------------------


def scaler_args(scale, found):
    return np.array(scale, np.float32), np.array(found, np.float32)


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.2),
                                  lambda ps: optim.AdamW(ps, lr=0.1, amsgrad=True)], ids=["SGD", "AdamW"])
def test_grad_scale_divides_and_writes_the_unscaled_gradient_back(rng, make):
    params = make_params(rng, np.float32, [(100,), (3, 3)])
    control = copy.deepcopy(params)
    opt, opt_c = make(params), make(control)
    for _ in range(3):
        fresh_grads(rng, params, scale=1024.0)
        for p, c in zip(params, control):
            c.grad = (p.grad.astype(np.float64) / 1024.0).astype(np.float32)
        opt.grad_scale, opt.found_inf = scaler_args(1024.0, 0.0)
        opt.step()
        opt_c.step()
        for p, c in zip(params, control):
            assert_same(p.data, c.data)
            assert_same(p.grad, c.grad)  # unscaled in place, as torch's fused optimizers leave it


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5),
                                  lambda ps: optim.SGD(ps, lr=0.1),
                                  lambda ps: optim.Adam(ps, lr=0.1, weight_decay=0.1),
                                  lambda ps: optim.AdamW(ps, lr=0.1, amsgrad=True)],
                         ids=["SGD-momentum", "SGD", "Adam", "AdamW"])
def test_found_inf_skips_and_changes_nothing(rng, make):
    """The skipped step leaves parameters, gradients, state and step counts as they were, and
    the first step that runs is the first (SGD's buffer takes the gradient, Adam's bias
    corrections use step 1): the run equals one that never saw the skipped step."""
    params = make_params(rng, np.float32, [(50,), (2, 9)])
    control = copy.deepcopy(params)
    opt, opt_c = make(params), make(control)
    for i in range(4):
        fresh_grads(rng, params)
        for p, c in zip(params, control):
            c.grad = p.grad.copy()
        skip = i in (0, 2)
        before = [(p.data.copy(), p.grad.copy()) for p in params]
        opt.grad_scale, opt.found_inf = scaler_args(1.0, 1.0 if skip else 0.0)
        opt.step()
        if skip:
            for p, (data, grad) in zip(params, before):
                assert_same(p.data, data)
                assert_same(p.grad, grad)
        else:
            opt_c.step()
        for p, c in zip(params, control):
            assert_same(p.data, c.data)
    for p, c in zip(params, control):
        for key, value in opt_c.state[c].items():
            if value is None:
                assert opt.state[p][key] is None
            else:
                assert_same(opt.state[p][key], value, key)


def test_a_scaler_number_for_found_inf():
    """GradScaler hands found_inf over as the int 0 when it checked nothing."""
    p = optim.Parameter(np.ones(3, np.float32))
    p.grad = np.ones(3, np.float32)
    opt = optim.SGD([p], lr=0.5)
    opt.found_inf = 0
    opt.step()
    np.testing.assert_array_equal(p.data, 0.5)


SKIP_ITER = 2


class Net:
    """Two linear layers with an MSE loss and a written-out backward, on ampc.optim parameters."""

    def __init__(self, rng):
        self.w1 = optim.Parameter((rng.standard_normal((8, 8)) / 3).astype(np.float32))
        self.b1 = optim.Parameter((rng.standard_normal(8) / 3).astype(np.float32))
        self.w2 = optim.Parameter((rng.standard_normal((8, 8)) / 3).astype(np.float32))
        self.b2 = optim.Parameter((rng.standard_normal(8) / 3).astype(np.float32))

    def params(self):
        return [self.w1, self.b1, self.w2, self.b2]

    def backward(self, x, target, seed):
        h = x @ self.w1.data.T + self.b1.data
        y = h @ self.w2.data.T + self.b2.data
        dy = (np.float32(2.0 / y.size) * np.float32(seed)) * (y - target)
        dh = dy @ self.w2.data
        self.w2.grad, self.b2.grad = (dy.T @ h).astype(np.float32), dy.sum(0)
        self.w1.grad, self.b1.grad = (dh.T @ x).astype(np.float32), dh.sum(0)


OPTIMIZERS = {
    "SGD": lambda ps: optim.SGD(ps, lr=1.0),
    "SGD-momentum": lambda ps: optim.SGD(ps, lr=0.5, momentum=0.9, dampening=0.1, nesterov=False),
    "Adam": lambda ps: optim.Adam(ps, lr=0.05, amsgrad=True),
    "AdamW": lambda ps: optim.AdamW(ps, lr=0.05, weight_decay=0.1),
}


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("separate_unscale", [False, True])
def test_scaling_case_with_ampc_optimizers(name, separate_unscale):
    """torch's test_grad_scaling_autocast recipe without autocast: the control steps plainly,
    the scaled run goes through GradScaler.step (the optimizer unscales and skips itself),
    an inf at iteration 2. Scales are powers of two, so the runs agree bit for bit (torch
    only gets within atol for Adam; here the division by the scale is exact)."""
    rng = np.random.default_rng(7)
    control = Net(rng)
    scaled = copy.deepcopy(control)
    opt_c, opt_s = OPTIMIZERS[name](control.params()), OPTIMIZERS[name](scaled.params())
    scaler = ampc.GradScaler("cpu", init_scale=128.0, growth_interval=1)
    for i in range(4):
        x, t = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
        control.backward(x, t, 1.0)
        if i != SKIP_ITER:
            opt_c.step()
        scaled.backward(x, t, scaler.scale(np.float32(1.0)))
        if i == SKIP_ITER:
            scaled.w2.grad[3, 4] = np.inf
        if separate_unscale:
            scaler.unscale_(opt_s)
        scaler.step(opt_s)
        scaler.update()
    assert scaler.get_scale() == 128.0 * 2**3 * 0.5
    for c, s in zip(control.params(), scaled.params()):
        assert_same(s.data, c.data)
    for c, s in zip(control.params(), scaled.params()):
        for key, value in opt_c.state[c].items():
            if value is not None:
                assert_same(opt_s.state[s][key], value, key)


def test_first_sgd_step_skipped_by_the_scaler():
    """A skipped first step leaves SGD's next step the first one, and a state dict taken in
    between has no buffer (what torch would have)."""
    rng = np.random.default_rng(3)
    control = Net(rng)
    scaled = copy.deepcopy(control)
    make = OPTIMIZERS["SGD-momentum"]
    opt_c, opt_s = make(control.params()), make(scaled.params())
    scaler = ampc.GradScaler("cpu", init_scale=2.0**10)
    for i in range(3):
        x, t = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
        control.backward(x, t, 1.0)
        if i != 0:
            opt_c.step()
        scaled.backward(x, t, scaler.scale(np.float32(1.0)))
        if i == 0:
            scaled.b1.grad[0] = np.nan
        scaler.step(opt_s)
        scaler.update()
        if i == 0:
            assert all(s["momentum_buffer"] is None for s in opt_s.state_dict()["state"].values())
    for c, s in zip(control.params(), scaled.params()):
        assert_same(s.data, c.data)


def test_step_counts_only_steps_that_ran():
    rng = np.random.default_rng(5)
    net = Net(rng)
    opt = optim.Adam(net.params(), lr=0.01)
    scaler = ampc.GradScaler("cpu", init_scale=256.0)
    for i in range(5):
        x, t = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
        net.backward(x, t, scaler.scale(np.float32(1.0)))
        if i in (1, 3):
            net.w1.grad[0, 0] = -np.inf
        scaler.step(opt)
        scaler.update()
    assert {float(s["step"]) for s in opt.state.values()} == {3.0}
    assert scaler.stats()["steps"] == 5 and scaler.stats()["skipped_steps"] == 2


def total_norm(grads, inv_scale):
    return np.sqrt(sum(float(((g.astype(np.float64) * inv_scale) ** 2).sum()) for g in grads))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_deferred_clipping(name):
    """unscale_(max_norm=, defer=True) only reads the gradients: .grad stays scaled until the
    step, which gets scale / coefficient as its grad_scale and writes the unscaled, clipped
    gradients back (a rounded divisor, then one division: within two ulps of the exact value); the
    parameters follow the eager clip's up to that rounding; an inf skips the step and leaves the
    gradients scaled. The scale (96, not a power of two) follows torch's rule: 96 * 2**3 * 0.5."""
    max_norm = 0.05
    rng = np.random.default_rng(11)
    eager = Net(rng)
    deferred = copy.deepcopy(eager)
    opt_e, opt_d = OPTIMIZERS[name](eager.params()), OPTIMIZERS[name](deferred.params())
    se, sd = (ampc.GradScaler("cpu", init_scale=96.0, growth_interval=1) for _ in range(2))
    for i in range(4):
        x, t = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32)
        for net, s in ((eager, se), (deferred, sd)):
            net.backward(x, t, s.scale(np.float32(1.0)))
            if i == SKIP_ITER:
                net.w2.grad[3, 4] = np.inf
        scale = sd.get_scale()
        scaled = [p.grad.copy() for p in deferred.params()]
        se.unscale_(opt_e, max_norm=max_norm)
        norm = sd.unscale_(opt_d, max_norm=max_norm, defer=True)
        for g, p in zip(scaled, deferred.params()):
            assert_same(p.grad, g, "before the step")
        sd.step(opt_d)
        se.step(opt_e)
        for s in (se, sd):
            s.update()
        if i == SKIP_ITER:
            assert not np.isfinite(norm)
            for g, p in zip(scaled, deferred.params()):
                assert_same(p.grad, g, "after a skipped step")
        else:
            expected_norm = total_norm(scaled, 1.0 / scale)
            assert float(norm) == pytest.approx(expected_norm, rel=1e-6)
            coef = max_norm / (expected_norm + 1e-6)
            assert coef < 0.5  # the case clips
            for g, p in zip(scaled, deferred.params()):
                # the divisor (scale / coefficient) and the division each round once: two ulps at most
                np.testing.assert_allclose(p.grad, g.astype(np.float64) / scale * coef, rtol=2**-22, atol=0)
        for a, b in zip(eager.params(), deferred.params()):
            np.testing.assert_allclose(b.data, a.data, rtol=1e-5, atol=1e-7)
    assert sd.get_scale() == se.get_scale() == 96.0 * 2**3 * 0.5


# ---------------------------------------------------------------------------
# torch's constructor checks, defaults and texts
# ---------------------------------------------------------------------------


def one_param():
    p = optim.Parameter(np.zeros(3, np.float32))
    return [p]


@pytest.mark.parametrize("make, match", [
    (lambda: optim.SGD(one_param(), lr=-0.1), "Invalid learning rate: -0.1"),
    (lambda: optim.SGD(one_param(), momentum=-1), "Invalid momentum value: -1"),
    (lambda: optim.SGD(one_param(), weight_decay=-1e-3), "Invalid weight_decay value: -0.001"),
    (lambda: optim.SGD(one_param(), nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    (lambda: optim.SGD(one_param(), momentum=0.9, dampening=0.1, nesterov=True), "Nesterov momentum requires"),
    (lambda: optim.Adam(one_param(), lr=float("nan")), "Invalid learning rate: nan"),
    (lambda: optim.Adam(one_param(), eps=-1.0), "Invalid epsilon value: -1.0"),
    (lambda: optim.Adam(one_param(), betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    (lambda: optim.AdamW(one_param(), betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    (lambda: optim.AdamW(one_param(), weight_decay=-1), "Invalid weight_decay value: -1"),
    (lambda: optim.SGD([]), "optimizer got an empty parameter list"),
    (lambda: optim.SGD([{"params": one_param()}, {"params": one_param() * 2}]), "duplicate parameters"),
])
def test_constructor_checks(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_constructor_type_checks():
    with pytest.raises(TypeError, match="should be an iterable of Tensors or dicts, but got Parameter"):
        optim.SGD(one_param()[0])
    with pytest.raises(TypeError, match="optimizer can only optimize Tensors, but one of the params is ndarray; "
                       r"wrap each array in ampc.optim.Parameter\(array\)"):
        optim.SGD([np.zeros(3)])
    with pytest.raises(TypeError, match="one of the params is int$"):  # no array: torch's text alone
        optim.SGD([3])
    with pytest.raises(TypeError, match="ordering of tensors in sets will change"):
        optim.SGD([{"params": set(one_param())}])
    shared = one_param()
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        optim.SGD([{"params": shared}, {"params": shared}])


def test_defaults_are_torchs():
    assert optim.SGD(one_param()).defaults == dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                                                   nesterov=False, maximize=False)
    assert optim.Adam(one_param()).defaults == dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                                    amsgrad=False, maximize=False)
    assert optim.AdamW(one_param()).defaults["weight_decay"] == 1e-2
    for cls in (optim.SGD, optim.Adam, optim.AdamW):
        assert cls._step_supports_amp_scaling is True


def test_param_groups_take_their_own_settings(rng):
    a, b = make_params(rng, np.float32, [(5,), (5,)])
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 0.5}], lr=0.1, momentum=0.9)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["momentum"] == 0.9
    fresh_grads(rng, [a, b])
    ea, _, _ = sgd_step_exact(a.data, a.grad, None, True, lr=0.1, momentum=0.9)
    eb, _, _ = sgd_step_exact(b.data, b.grad, None, True, lr=0.5, momentum=0.9)
    opt.step()
    assert_same(a.data, ea)
    assert_same(b.data, eb)


def test_step_runs_the_closure_first(rng):
    params = make_params(rng, np.float32, [(4,)])
    calls = []

    def closure():
        calls.append(1)
        fresh_grads(rng, params)
        return 42.0

    assert optim.SGD(params, lr=0.1).step(closure) == 42.0
    assert calls == [1]


def test_zero_grad(rng):
    params = make_params(rng, np.float32, [(4,), (2, 2)])
    fresh_grads(rng, params)
    grads = [p.grad for p in params]
    opt = optim.SGD(params)
    opt.zero_grad(set_to_none=False)
    for p, g in zip(params, grads):
        assert p.grad is g and not g.any()
    opt.zero_grad()
    assert all(p.grad is None for p in params)


# ---------------------------------------------------------------------------
# Bad input: a clear error, nothing changed
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("spoil, error, match", [
    (lambda p: setattr(p, "grad", np.zeros(p.shape, np.int32)), TypeError, r"grads\[2\] has dtype int32"),
    (lambda p: setattr(p, "grad", np.zeros(p.shape, np.float16)), TypeError, "but its parameter has float32"),
    (lambda p: setattr(p, "grad", np.zeros(p.shape[::-1], np.float32)), ValueError, "parameter's shape"),
    (lambda p: setattr(p, "grad", np.zeros((p.shape[0], 2 * p.shape[1]), np.float32)[:, ::2]), ValueError,
     "parameter's shape, device and strides"),
    (lambda p: setattr(p, "grad", "a string"), TypeError, "grads"),
    (lambda p: setattr(p, "data", np.zeros((3, 8), np.float32)[:, ::2]), ValueError, r"params\[2\] is not dense"),
    (lambda p: p.data.setflags(write=False), ValueError, r"params\[2\] is read-only"),
])
@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: optim.AdamW(ps)],
                         ids=["SGD", "AdamW"])
def test_bad_input_changes_nothing(rng, spoil, error, match, make):
    params = make_params(rng, np.float32, [(6,), (5,), (3, 4)])
    fresh_grads(rng, params)
    opt = make(params)
    opt.step()
    before_state = copy.deepcopy(opt.state_dict())
    fresh_grads(rng, params)
    spoil(params[2])
    before = [(np.array(p.data, copy=True), np.array(p.grad, copy=True) if isinstance(p.grad, np.ndarray) else None)
              for p in params]
    with pytest.raises(error, match=match):
        opt.step()
    for p, (data, grad) in zip(params, before):
        assert_same(p.data, data)
        if grad is not None:
            assert_same(p.grad, grad)
    after = opt.state_dict()
    assert after["param_groups"] == before_state["param_groups"]
    for k, s in before_state["state"].items():
        for key, value in s.items():
            if value is not None:
                assert_same(after["state"][k][key], value)


def test_numpy_scalars_are_read_only():
    """A NumPy scalar is immutable: ampc reads a copy, so writing into one would be lost. A
    Parameter refuses one when made (as torch's refuses what is not a tensor); a read-only array
    is refused when a step would write it."""
    for not_an_array in (np.float32(1.5), 1.5, [1.0, 2.0], None, "x"):
        with pytest.raises(TypeError, match="Parameter: data must be an array"):
            optim.Parameter(not_an_array)
    p = optim.Parameter(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="Parameter.data must be an array"):
        p.data = [1.0, 2.0]
    assert p.data.shape == (2,)
    frozen = np.ones(2, np.float32)
    frozen.setflags(write=False)
    p.data, p.grad = frozen, np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"params\[0\] is read-only"):
        optim.SGD([p], lr=0.5).step()
    with pytest.raises(ValueError, match="read-only"):
        ampc.cast(np.float32(1.0), out=np.float16(0.0))


def test_read_only_gradient_is_fine_unless_written():
    p = optim.Parameter(np.ones(4, np.float32))
    p.grad = np.full(4, 2.0, np.float32)
    p.grad.setflags(write=False)
    opt = optim.SGD([p], lr=0.25)
    opt.step()
    np.testing.assert_array_equal(p.data, 0.5)
    opt.grad_scale, opt.found_inf = scaler_args(2.0, 0.0)
    with pytest.raises(ValueError, match=r"grads\[0\] is read-only"):
        opt.step()
    np.testing.assert_array_equal(p.data, 0.5)


def test_scaler_arrays_must_be_float32_scalars():
    p = optim.Parameter(np.ones(4, np.float32))
    p.grad = np.ones(4, np.float32)
    opt = optim.SGD([p], lr=0.25)
    for grad_scale in (np.ones(2, np.float32), np.array(1.0, np.float64)):
        opt.grad_scale = grad_scale
        with pytest.raises(ValueError, match="grad_scale must be a one-element float32 array on cpu"):
            opt.step()
    np.testing.assert_array_equal(p.data, 1.0)


# ---------------------------------------------------------------------------
# State dicts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
                                  lambda ps: optim.SGD(ps, lr=0.1),
                                  lambda ps: optim.Adam(ps, lr=0.01, amsgrad=True),
                                  lambda ps: optim.AdamW(ps, lr=0.01)], ids=["SGD-nesterov", "SGD", "Adam", "AdamW"])
def test_state_dict_round_trip_continues_identically(rng, make):
    params = make_params(rng, np.float32, [(9,), (4, 4)])
    opt = make(params)
    for _ in range(3):
        fresh_grads(rng, params)
        opt.step()
    saved = pickle.loads(pickle.dumps(opt.state_dict()))
    twin = copy.deepcopy(params)
    opt_twin = make(twin)
    opt_twin.load_state_dict(saved)
    for _ in range(3):
        fresh_grads(rng, params)
        for p, q in zip(params, twin):
            q.grad = p.grad.copy()
        opt.step()
        opt_twin.step()
    for p, q in zip(params, twin):
        assert_same(q.data, p.data)


def test_state_dict_layout_is_torchs(rng):
    params = make_params(rng, np.float32, [(3,), (2,)])
    fresh_grads(rng, params)
    opt = optim.Adam([{"params": [params[0]]}, {"params": [params[1]], "lr": 0.5}], amsgrad=True)
    opt.step()
    sd = opt.state_dict()
    assert list(sd) == ["state", "param_groups"]
    assert sd["param_groups"] == [
        dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=True, maximize=False, params=[0]),
        dict(lr=0.5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=True, maximize=False, params=[1]),
    ]
    assert list(sd["state"]) == [0, 1]
    assert list(sd["state"][0]) == ["step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"]
    assert sd["state"][0]["exp_avg"] is opt.state[params[0]]["exp_avg"]  # references, as torch's


def test_load_a_torch_shaped_state_dict(rng):
    """torch's non-fused Adam keeps step as a CPU tensor (or, in old checkpoints, a number) and
    its state may come in another dtype: loaded into arrays like the parameter's."""
    p = optim.Parameter(rng.standard_normal(5).astype(np.float32))
    m = rng.standard_normal(5)
    v = rng.random(5)
    opt = optim.Adam([p], lr=0.1)
    opt.load_state_dict({"state": {0: {"step": 4, "exp_avg": m, "exp_avg_sq": v}},
                         "param_groups": [dict(lr=0.2, betas=(0.8, 0.99), eps=1e-8, weight_decay=0.0, amsgrad=False,
                                               maximize=False, foreach=None, fused=None, capturable=False,
                                               differentiable=False, params=[0])]})
    s = opt.state[p]
    assert s["step"].dtype == np.float32 and float(s["step"]) == 4.0
    assert s["exp_avg"].dtype == np.float32 and s["exp_avg"] is not m
    assert_same(s["exp_avg"], ampc.cast(m, "float32"))
    assert opt.param_groups[0]["lr"] == 0.2 and opt.param_groups[0]["params"] == [p]
    p.grad = rng.standard_normal(5).astype(np.float32)
    expected, _, _ = adam_step_exact(p.data, p.grad, {"step": 4.0, "exp_avg": s["exp_avg"].copy(),
                                                      "exp_avg_sq": s["exp_avg_sq"].copy()},
                                     lr=0.2, beta1=0.8, beta2=0.99)
    opt.step()
    assert_same(p.data, expected)


def test_load_state_dict_errors_change_nothing(rng):
    params = make_params(rng, np.float32, [(3,), (2,)])
    fresh_grads(rng, params)
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    opt.step()
    sd = opt.state_dict()
    state = dict(opt.state)
    with pytest.raises(ValueError, match="different number of parameter groups"):
        opt.load_state_dict({"state": {}, "param_groups": sd["param_groups"] * 2})
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        opt.load_state_dict({"state": {}, "param_groups": [dict(sd["param_groups"][0], params=[0])]})
    assert opt.state == state
    for bad, error, text in [({}, ValueError, "state_dict has no 'state' entry"),
                             ({"state": {}}, ValueError, "no 'param_groups' entry"),
                             ([], TypeError, "state_dict must be a dict"),
                             ({"state": {}, "param_groups": "x"}, TypeError, "must be a list of dicts"),
                             ({"state": {}, "param_groups": [{}]}, TypeError, "each with a 'params' list"),
                             ({"state": {0: 1}, "param_groups": sd["param_groups"]}, TypeError, "a dict of dicts"),
                             ({"state": {0: {"momentum_buffer": np.ones(4)}}, "param_groups": sd["param_groups"]},
                              ValueError, r"'momentum_buffer' must be an array of its shape \(3,\), got \(4,\)"),
                             ({"state": {0: {"momentum_buffer": [1.0, 2.0, 3.0]}}, "param_groups": sd["param_groups"]},
                              ValueError, "got list")]:
        with pytest.raises(error, match=text):
            opt.load_state_dict(bad)
        assert opt.state == state
    with pytest.raises(TypeError, match="defaults must be a dict"):
        optim.Optimizer(params, None)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def test_zeros_like_and_scalar_like():
    x = np.asfortranarray(np.full((3, 4), 7.0, np.float32))
    z = _C.zeros_like(x)
    assert z.dtype == np.float32 and z.shape == (3, 4) and z.flags.f_contiguous and not z.any()
    z = _C.zeros_like(x, dtype="bfloat16", shape=(2,))
    assert z.dtype == ml_dtypes.bfloat16 and z.shape == (2,) and not z.astype(np.float32).any()
    s = _C._scalar_like(x, 2.5)
    assert s.dtype == np.float32 and s.shape == () and float(s) == 2.5
    assert _C._item(s) == 2.5
    with pytest.raises(ValueError, match="one-element float32"):
        _C._item(x)


def test_bad_input_in_a_later_group_changes_no_group(rng):
    a, b = make_params(rng, np.float32, [(5,), (4,)])
    fresh_grads(rng, [a, b])
    b.grad = np.zeros(3, np.float32)
    before = a.data.copy()
    for make in (lambda g: optim.SGD(g, lr=0.1, momentum=0.9), lambda g: optim.Adam(g, lr=0.1)):
        opt = make([{"params": [a]}, {"params": [b], "lr": 0.5}])
        with pytest.raises(ValueError, match=r"grads\[0\] must have its parameter's shape"):
            opt.step()
        assert_same(a.data, before)
        assert opt.state == {}
        b.grad = np.zeros(4, np.float32)
        opt.step()
        assert set(opt.state) == {a, b}
        a.data[...] = before
        b.grad = np.zeros(3, np.float32)


def test_arrays_that_share_memory_are_refused(rng):
    base = rng.standard_normal(20).astype(np.float32)
    before = base.copy()
    p, q = optim.Parameter(base[:10]), optim.Parameter(base[5:15])
    p.grad, q.grad = np.ones(10, np.float32), np.ones(10, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        optim.SGD([p, q], lr=0.1).step()
    r = optim.Parameter(base[15:])
    r.grad = r.data
    with pytest.raises(ValueError, match="share memory"):
        optim.Adam([r]).step()
    assert_same(base, before)
    # Gradients that are only read may be shared; written back (with a scale) they may not.
    a, b = make_params(rng, np.float32, [(6,), (6,)])
    a.grad = b.grad = np.full(6, 2.0, np.float32)
    a0, b0 = a.data.copy(), b.data.copy()
    optim.SGD([a, b], lr=0.5).step()
    assert_same(a.data, a0 - np.float32(1.0))
    assert_same(b.data, b0 - np.float32(1.0))
    opt = optim.SGD([a, b], lr=0.5)
    opt.grad_scale = np.full((), 2.0, np.float32)
    with pytest.raises(ValueError, match="share memory"):
        opt.step()
