"""ampc.GradScaler on NumPy: PyTorch's GradScaler tests (spec/torch-amp.md 5.1)
ported, its error texts and state machine, the update rule bit for bit, and
what ampc adds (bounds, hysteresis, stats, overflow reports, fused clipping)."""

import json
import math
import pickle
import sys
import threading
import time
import warnings

import ml_dtypes
import numpy as np
import pytest

import ampc
from scaling_case import SGD, Param, params_of, scaling_case

SKIP_ITER = 2


def opt_with(*grads):
    params = []
    for g in grads:
        p = Param(None if g is None else np.zeros_like(g))
        p.grad = g
        params.append(p)
    return SGD(params)


def cpu_scaler(**kw):
    kw.setdefault("init_scale", 128.0)
    s = ampc.GradScaler("cpu", **kw)
    s.scale(np.float32(1.0))  # creates the scale, as the first scale(loss) of an iteration does
    return s


# ---------------------------------------------------------------------------
# Construction and the disabled scaler
# ---------------------------------------------------------------------------


def test_defaults_and_getters():
    s = ampc.GradScaler("cpu")
    assert s.is_enabled() and s.get_scale() == 2.0**16
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (2.0, 0.5, 2000)
    assert s._get_growth_tracker() == 0
    s.set_growth_factor(3.0)
    s.set_backoff_factor(0.25)
    s.set_growth_interval(7)
    assert (s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval()) == (3.0, 0.25, 7)
    assert ampc.GradScaler is ampc.amp.GradScaler


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(growth_factor=1.0), ampc.ArgumentError, r"^The growth factor must be > 1\.0\.$"),
        (dict(backoff_factor=1.0), ampc.ArgumentError, r"^The backoff factor must be < 1\.0\.$"),
        (dict(backoff_factor=0.0), ValueError, r"backoff_factor must be in \(0, 1\]"),
        (dict(init_scale=0.0), ValueError, "positive finite"),
        (dict(init_scale=float("nan")), ValueError, "positive finite"),
        (dict(init_scale=1e39), ValueError, "positive finite"),
        (dict(growth_interval=-1), ValueError, "growth_interval must be >= 0"),
        (dict(growth_interval=2**63), ValueError, "growth_interval is out of range"),
        (dict(growth_interval=2.5), TypeError, "must be an int"),
        (dict(init_scale="1"), TypeError, "must be a number"),
        (dict(min_scale=4.0, max_scale=2.0, init_scale=3.0), ValueError, "min_scale <= max_scale"),
        (dict(min_scale=2.0**17), ValueError, "outside"),
        (dict(hysteresis=0), ValueError, "hysteresis"),
    ],
)
def test_constructor_checks(kwargs, error, match):
    with pytest.raises(error, match=match):
        ampc.GradScaler("cpu", **kwargs)


def test_argument_error_is_both_kinds():
    assert issubclass(ampc.ArgumentError, ValueError) and issubclass(ampc.ArgumentError, AssertionError)


def test_device_argument():
    with pytest.raises(TypeError, match="device must be a str"):
        ampc.GradScaler(0)
    with pytest.raises(ValueError, match="'cuda' or 'cpu'"):
        ampc.GradScaler("tpu")


@pytest.mark.skipif(ampc.cuda.is_available(), reason="a GPU is present")
def test_cuda_scaler_without_a_gpu_disables_itself():
    with pytest.warns(UserWarning, match=r"CUDA is not available\.  Disabling\."):
        s = ampc.GradScaler()
    assert not s.is_enabled()
    with pytest.warns(FutureWarning, match="deprecated"):
        with pytest.warns(UserWarning):
            legacy = ampc.cuda.amp.GradScaler(init_scale=4.0)
    assert isinstance(legacy, ampc.GradScaler) and not legacy.is_enabled()


def test_disabled_scaler_passes_through():
    s = ampc.GradScaler("cpu", enabled=False)
    loss = np.float32(3.0)
    assert s.scale(loss) is loss
    opt = opt_with(np.full(3, np.inf, np.float32))
    assert s.unscale_(opt) is None
    assert s.step(opt) is None and opt.steps == 1  # even with inf grads: nothing is checked
    assert s.step(opt, return_found_inf=True) == (None, False)
    s.update()
    assert s.get_scale() == 1.0 and s.state_dict() == {} and s._get_growth_tracker() == 0
    s.load_state_dict({"scale": 5.0})  # a no-op


# ---------------------------------------------------------------------------
# scale
# ---------------------------------------------------------------------------


def test_scale_dtypes_follow_torch():
    s = ampc.GradScaler("cpu", init_scale=4.0)
    assert s.scale(np.float32(2.5)) == 10.0 and type(s.scale(np.float32(2.5))) is np.float32
    assert s.scale(np.array(2.5, np.float16)).dtype == np.float32  # 0-d fp16 * fp32 scale -> fp32
    assert s.scale(np.array(2.5, ml_dtypes.bfloat16)).dtype == np.float32
    assert s.scale(np.ones(3, np.float16)).dtype == np.float16  # an N-d tensor keeps its dtype
    assert s.scale(np.array(2.5)).dtype == np.float64
    np.testing.assert_array_equal(s.scale(np.arange(4, dtype=np.float32)[::-1]), [12, 8, 4, 0])
    with pytest.raises(TypeError, match="floating"):
        s.scale(np.ones(2, np.int32))


def test_scale_nested_and_iterables():
    s = ampc.GradScaler("cpu", init_scale=2.0)
    four = np.array([4.0], np.float32)
    out = s.scale([four, (four, [four]), four])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    for v in (out[0], out[1][0], out[1][1][0], out[2]):
        np.testing.assert_array_equal(v, [8.0])
    lazy = s.scale(iter([four, four]))
    assert isinstance(lazy, map)
    assert [v.tolist() for v in lazy] == [[8.0], [8.0]]
    with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
        s.scale(2.5)
    # a string is iterable, its characters strings again: torch's lazy map recurses without end once
    # it is read; ampc refuses it up front, alone or nested
    for bad in ("loss", b"loss", [four, "x"]):
        with pytest.raises(ValueError, match="outputs must be a Tensor or an iterable of Tensors"):
            s.scale(bad)


# ---------------------------------------------------------------------------
# unscale_ (torch's test_grad_scaling_unscale, on the public API)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced", "reversed"])
@pytest.mark.parametrize("bad", [None, np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("where", [0, 1])
def test_unscale(isa, dtype, layout, bad, where):
    s = cpu_scaler(init_scale=4.0)
    base = [np.full((20, 20), 4.0, dtype) for _ in range(2)]
    views = {
        "contiguous": lambda a: a,
        "transposed": lambda a: a.T,
        "sliced": lambda a: a[:, :5],  # not dense: the strided path
        "reversed": lambda a: a[::-1],
    }[layout]
    grads = [views(a) for a in base]
    if bad is not None:
        grads[where][2, 2] = bad
    opt = opt_with(*grads)
    s.unscale_(opt)
    found = s._found_inf_per_device(opt)
    assert list(found) == ["cpu"] and float(found["cpu"]) == (0.0 if bad is None else 1.0)
    for i, g in enumerate(grads):
        expected = np.ones(g.shape, np.float64)
        if bad is not None and i == where:
            expected[2, 2] = bad / 4
        np.testing.assert_array_equal(g.astype(np.float64), expected)
    if layout == "sliced":
        assert (base[0][:, 5:].astype(np.float64) == 4.0).all()  # outside the view: untouched


def test_unscale_refuses_fp16_like_torch_and_touches_nothing():
    s = cpu_scaler(init_scale=4.0)
    g32 = np.full(5, 4.0, np.float32)
    opt = opt_with(g32, np.full(5, 4.0, np.float16))
    with pytest.raises(ValueError, match=r"^Attempting to unscale FP16 gradients\.$"):
        s.unscale_(opt)
    assert (g32 == 4.0).all()
    s._check_inf_per_device(opt)  # the check-only pass accepts float16, as torch's does
    assert float(s._found_inf_per_device(opt)["cpu"]) == 0.0


@pytest.mark.parametrize(
    "make_bad,error,match",
    [
        (lambda: np.zeros(4, np.int32), TypeError, r"param_groups\[0\]\['params'\]\[1\]\.grad has dtype int32"),
        (lambda: np.zeros(4, np.complex64), TypeError, "does not support"),
        (lambda: np.broadcast_to(np.float32(1), (4,)), ValueError, "read-only"),
        (lambda: np.lib.stride_tricks.as_strided(np.zeros(4, np.float32), (4,), (0,), writeable=True), ValueError,
         "share memory"),
        (lambda: [1.0, 2.0], TypeError, "must be an array"),
    ],
)
def test_bad_gradients_leave_everything_untouched(make_bad, error, match):
    s = cpu_scaler(init_scale=4.0)
    good = np.full(4, 4.0, np.float32)
    opt = opt_with(good, make_bad())
    with pytest.raises(error, match=match):
        s.unscale_(opt)
    assert (good == 4.0).all()
    s.unscale_(opt_with(good))  # the optimizer's state did not move: a clean one works
    assert (good == 1.0).all()


@pytest.mark.parametrize("entry", [None, "w", 3.0])
def test_an_entry_of_params_that_is_no_parameter(entry):
    """None or a string among an optimizer's params: a TypeError naming the entry (torch's own
    unscale_ gives the AttributeError of `.grad`), nothing divided."""
    s = cpu_scaler(init_scale=4.0)
    good = np.full(4, 4.0, np.float32)
    opt = opt_with(good)
    opt.param_groups[0]["params"].append(entry)
    with pytest.raises(TypeError, match=rf"param_groups\[0\]\['params'\]\[1\] must be a parameter .*got "
                                        rf"{type(entry).__name__}"):
        s.unscale_(opt)
    assert (good == 4.0).all() and s.get_scale() == 4.0
    s.unscale_(opt_with(good))
    assert (good == 1.0).all()


@pytest.mark.parametrize("optimizer", ["sgd", None, 3.0, np.ones(2, np.float32)], ids=repr)
def test_something_that_is_no_optimizer(optimizer):
    """unscale_, step and overflow_report given no optimizer: a TypeError saying what was wanted (it
    was the AttributeError of .param_groups), the scaler as it was."""
    s = cpu_scaler(init_scale=4.0)
    for call in (s.unscale_, s.step, s.overflow_report):
        with pytest.raises(TypeError, match=r"optimizer must be an optimizer \(an object with param_groups\), got"):
            call(optimizer)
    assert s.get_scale() == 4.0
    good = np.full(2, 4.0, np.float32)
    s.unscale_(opt_with(good))
    assert (good == 1.0).all()


@pytest.mark.parametrize("group", [3, {}, {"lr": 0.1}], ids=repr)
def test_a_param_group_that_is_no_group(group):
    s = cpu_scaler(init_scale=4.0)
    opt = opt_with(np.full(2, 4.0, np.float32))
    opt.param_groups.append(group)
    with pytest.raises(TypeError, match=r"optimizer\.param_groups\[1\] must be a dict with 'params', got"):
        s.unscale_(opt)
    assert (opt.param_groups[0]["params"][0].grad == 4.0).all()


def test_perfect_storm(rng):
    """Many gradients of awkward sizes and mixed dtypes; an inf injected at each position in
    turn: found_inf is exactly 1, never missed, never counted twice."""
    sizes = rng.integers(1, 4098, 60)
    dtypes = [np.float32, ml_dtypes.bfloat16, np.float64]
    for inject in [-1, 0, 1, 17, 59]:
        s = cpu_scaler(init_scale=8.0)
        grads = [np.full(n, 8.0, dtypes[i % 3]) for i, n in enumerate(sizes)]
        grads[7] = np.full((30, 40), 8.0, np.float32)[:, ::3]  # one strided
        if inject >= 0:
            g = grads[inject]
            g.flat[rng.integers(0, g.size)] = np.nan if inject % 2 else np.inf
        opt = opt_with(*grads)
        s.unscale_(opt)
        assert float(s._found_inf_per_device(opt)["cpu"]) == (1.0 if inject >= 0 else 0.0)
        for i, g in enumerate(grads):
            finite = np.isfinite(g.astype(np.float64))
            assert (g.astype(np.float64)[finite] == 1.0).all()
            assert finite.all() == (i != inject)


def test_ten_thousand_gradients_one_bad_element(rng):
    grads = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 300, 10_000)]
    grads[6543][-1] = np.inf
    before = [g.copy() for g in grads]
    s = cpu_scaler(init_scale=2.0)
    opt = opt_with(*grads)
    assert s.step(opt, return_found_inf=True) == (None, True)
    assert opt.steps == 0
    for g, b in zip(grads[:100], before[:100]):
        np.testing.assert_array_equal(g, b / 2)


def test_threads_give_identical_results(rng):
    x = rng.standard_normal(3_000_017).astype(np.float32) * 1000
    results = []
    before = ampc.get_num_threads()
    try:
        for threads in (1, 4):
            ampc.set_num_threads(threads)
            g = x.copy()
            s = cpu_scaler(init_scale=3.0)  # not a power of two: real rounding
            s.unscale_(opt_with(g))
            results.append(g)
    finally:
        ampc.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], x * np.float32(1 / 3.0))


def test_a_scaler_runs_one_method_at_a_time():
    """step() runs the optimizer's Python code (where the GIL passes to other threads): an update()
    from another thread waits for it, while the stepping thread may call the scaler again."""
    s = cpu_scaler()
    entered, order = threading.Event(), []

    class SlowSGD(SGD):
        def step(self):
            entered.set()
            time.sleep(0.2)  # the GIL is free: another thread runs meanwhile
            order.append(("scale inside step", s.get_scale()))  # the same thread enters again
            super().step()
            order.append("step done")

    opt = SlowSGD([Param(np.zeros(3, np.float32))])
    opt.param_groups[0]["params"][0].grad = np.ones(3, np.float32)

    def other():
        entered.wait()
        s.update(new_scale=4.0)
        order.append("update done")

    thread = threading.Thread(target=other)
    thread.start()
    s.step(opt)
    thread.join()
    assert order == [("scale inside step", 128.0), "step done", "update done"]
    assert s.get_scale() == 4.0


def test_the_options_need_no_wait_for_a_step():
    """An optimizer's step that waits for a thread reading or setting the scaler's options: those
    calls take no lock (they touch one field under the GIL), so the thread is not stuck behind the
    step that waits for it (with the lock, this was a deadlock)."""
    s = cpu_scaler()
    seen = []

    def reader():
        seen.append((s.get_growth_factor(), s.get_backoff_factor(), s.get_growth_interval(), s.is_enabled()))
        s.set_growth_interval(7)

    class WaitingSGD(SGD):
        def step(self):
            helper = threading.Thread(target=reader)
            helper.start()
            helper.join(timeout=10)
            seen.append(helper.is_alive())
            super().step()

    opt = WaitingSGD([Param(np.zeros(3, np.float32))])
    opt.param_groups[0]["params"][0].grad = np.ones(3, np.float32)
    s.step(opt)
    assert seen == [(2.0, 0.5, 2000, True), False]
    assert s.get_growth_interval() == 7 and opt.steps == 1


def test_a_thread_waiting_for_the_scaler_can_be_interrupted():
    """Ctrl-C reaches a thread waiting for another thread's long step(), then, not after it. The step
    holds until the test lets it go (10 s at most, so that a wait Ctrl-C cannot break fails rather
    than hangs): no timing margin for a loaded machine to eat."""
    import _thread

    s = cpu_scaler()
    entered, release = threading.Event(), threading.Event()

    class SlowSGD(SGD):
        def step(self):
            entered.set()
            release.wait(10.0)
            super().step()

    opt = SlowSGD([Param(np.zeros(3, np.float32))])
    opt.param_groups[0]["params"][0].grad = np.ones(3, np.float32)
    stepping = threading.Thread(target=s.step, args=(opt,))
    stepping.start()
    entered.wait()
    threading.Timer(0.2, _thread.interrupt_main).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            s.update()
        assert opt.steps == 0 and stepping.is_alive()  # interrupted while waiting, not once the step ended
    finally:
        release.set()
        stepping.join()
    s.update()
    assert opt.steps == 1


def test_a_scaler_shared_by_threads_stays_sound():
    """Threads sharing one scaler (each with its own optimizer) while its kernels release the GIL:
    every call either works or raises torch's state error; the gradients each thread unscales come
    out divided by the scale exactly once, and the scaler ends in a state a scaler can have."""
    s = cpu_scaler(init_scale=2.0**10, growth_interval=3)
    errors, wrong = [], []

    def worker(k):
        grad = np.empty(100_003, np.float32)  # long enough for the unscale kernel to take a while
        opt = opt_with(grad)
        for i in range(60):
            grad[:] = k + 1
            try:
                scale = s.get_scale()
                s.unscale_(opt)
                if not (grad == np.float32(k + 1) / np.float32(scale)).all() and scale == s.get_scale():
                    wrong.append((k, i))
                s.update()
            except (RuntimeError, AssertionError) as error:  # torch's texts for another thread's turn:
                known = ("unscale_() has already been called", "No inf checks were recorded prior to update")
                if not str(error).startswith(known):  # its unscale_ after our update(), its update() first
                    errors.append(error)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
    state = s.state_dict()
    assert math.log2(state["scale"]).is_integer() and 2.0**10 <= state["scale"] <= 2.0**(10 + 240 // 3)
    assert 0 <= state["_growth_tracker"] < 3


def test_unscale_multiplies_by_the_float64_reciprocal():
    s = cpu_scaler(init_scale=3.0)
    g = np.array([1.0, 3.0, 1e-3, 7.0], np.float32)
    expected = g * np.float32(np.float64(1.0) / np.float64(np.float32(3.0)))
    s.unscale_(opt_with(g))
    np.testing.assert_array_equal(g, expected)


# ---------------------------------------------------------------------------
# The state machine and its texts
# ---------------------------------------------------------------------------


def test_scale_must_exist_first():
    s = ampc.GradScaler("cpu")
    opt = opt_with(np.ones(2, np.float32))
    for call, name in ((lambda: s.unscale_(opt), "unscale_"), (lambda: s.step(opt), "step"),
                       (lambda: s.update(), "update"), (lambda: s._check_inf_per_device(opt), "_check_inf_per_device")):
        with pytest.raises(AssertionError, match=rf"^Attempted {name} but _scale is None\.  This may indicate"):
            call()


def test_stage_errors():
    s = cpu_scaler()
    opt = opt_with(np.ones(2, np.float32))
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) has already been called on this optimizer since the last update\(\)\.$"):
        s.unscale_(opt)
    s.step(opt)
    with pytest.raises(RuntimeError, match=r"^unscale_\(\) is being called after step\(\)\.$"):
        s.unscale_(opt)
    with pytest.raises(RuntimeError, match=r"^step\(\) has already been called since the last update\(\)\.$"):
        s.step(opt)
    s.update()
    s.unscale_(opt)  # READY again


def test_no_inf_checks():
    s = cpu_scaler()
    with pytest.raises(AssertionError, match=r"^No inf checks were recorded prior to update\.$"):
        s.update()
    empty = opt_with(None, None)
    with pytest.raises(AssertionError, match=r"^No inf checks were recorded for this optimizer\.$"):
        s.step(empty)
    s.unscale_(opt_with(np.zeros(0, np.float32)))  # a zero-size gradient is still a check
    s.update()


def test_closure_is_refused():
    s = cpu_scaler()
    with pytest.raises(RuntimeError, match=r"^Closure use is not currently supported if GradScaler is enabled\.$"):
        s.step(opt_with(np.ones(2, np.float32)), closure=lambda: 0.0)


def test_decision_is_made_at_unscale_time():
    """torch's test_params_invalidated_with_grads_invalidated_between_unscale_and_step."""
    s = cpu_scaler()
    g = np.ones(3, np.float32)
    opt = opt_with(g)
    s.unscale_(opt)
    g[...] = np.inf
    s.step(opt)
    assert opt.steps == 1 and np.isinf(opt.param_groups[0]["params"][0].data).all()


def test_step_arguments_and_return():
    s = cpu_scaler()
    seen = {}

    class Opt(SGD):
        def step(self, *args, **kwargs):
            seen.update(args=args, kwargs=kwargs)
            return "stepped"

    opt = Opt([Param(np.zeros(2, np.float32))])
    opt.param_groups[0]["params"][0].grad = np.ones(2, np.float32)
    assert s.step(opt, 1, 2, flag=True, return_found_inf=True) == ("stepped", False)
    assert seen == {"args": (1, 2), "kwargs": {"flag": True}}


# ---------------------------------------------------------------------------
# The update rule
# ---------------------------------------------------------------------------


def run_update(s, found):
    s.scale(np.float32(1))
    s.unscale_(opt_with(np.array([np.inf if found else 1.0], np.float32)))
    s.update()


def test_update_rule_like_torch():
    """test_grad_scaling_update_scale: growth 2, backoff 0.25, interval 2, scale 4."""
    s = ampc.GradScaler("cpu", init_scale=4.0, growth_factor=2.0, backoff_factor=0.25, growth_interval=2)
    run_update(s, False)
    assert (s._get_growth_tracker(), s.get_scale()) == (1, 4.0)
    run_update(s, False)
    assert (s._get_growth_tracker(), s.get_scale()) == (0, 8.0)
    run_update(s, True)
    assert (s._get_growth_tracker(), s.get_scale()) == (0, 2.0)
    run_update(s, False)
    assert s._get_growth_tracker() == 1  # a clean step right after a skip counts from 0


@pytest.mark.parametrize("init,factor", [(1e38, 16.0), (2.0**127, 2.0)])
def test_scale_never_grows_into_inf(init, factor):
    s = ampc.GradScaler("cpu", init_scale=init, growth_factor=factor, growth_interval=1)
    for _ in range(5):
        run_update(s, False)
        assert s.get_scale() == np.float32(init) and s._get_growth_tracker() == 0


def test_huge_growth_interval_never_overflows_the_tracker():
    s = ampc.GradScaler("cpu", init_scale=2.0, growth_interval=2**31 - 1)
    s.load_state_dict({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2**31 - 1,
                       "_growth_tracker": 2**31 - 2})
    run_update(s, False)
    assert (s.get_scale(), s._get_growth_tracker()) == (4.0, 0)
    s.set_growth_interval(2**40)  # beyond the tracker's range: it saturates, never wraps
    s.load_state_dict({**s.state_dict(), "_growth_tracker": 2**31 - 1})
    run_update(s, False)
    assert (s.get_scale(), s._get_growth_tracker()) == (4.0, 2**31 - 1)


def test_repeated_backoff_stops_at_a_positive_scale_with_min_scale():
    s = ampc.GradScaler("cpu", init_scale=2.0**16, min_scale=1.0)
    for _ in range(30):
        run_update(s, True)
    assert s.get_scale() == 1.0
    plain = ampc.GradScaler("cpu", init_scale=2.0**16)
    for _ in range(30):
        run_update(plain, True)
    assert plain.get_scale() == 2.0**-14  # torch's rule has no floor


def test_max_scale():
    s = ampc.GradScaler("cpu", init_scale=4.0, growth_interval=1, max_scale=20.0)
    for expected in (8.0, 16.0, 20.0, 20.0):
        run_update(s, False)
        assert s.get_scale() == expected


def test_hysteresis():
    s = ampc.GradScaler("cpu", init_scale=64.0, hysteresis=3, growth_interval=1000)
    run_update(s, True)
    run_update(s, True)
    assert s.get_scale() == 64.0 and s.stats()["skipped_steps"] == 2  # skipped, not backed off
    run_update(s, True)
    assert s.get_scale() == 32.0  # the third overflow in a row
    run_update(s, True)
    assert s.get_scale() == 16.0  # still in a row
    run_update(s, False)
    run_update(s, True)
    assert s.get_scale() == 16.0  # a clean step restored the allowance


@pytest.mark.parametrize(
    "new_scale,error,match",
    [
        (np.array([1.0, 2.0], np.float32), AssertionError, "1-element"),
        ("2", TypeError, "new_scale must be a float"),
        (float("nan"), ValueError, "positive finite"),
        (0.0, ValueError, "positive finite"),
        (-4.0, ValueError, "positive finite"),
    ],
)
def test_update_new_scale_errors(new_scale, error, match):
    s = cpu_scaler(init_scale=8.0)
    with pytest.raises(error, match=match):
        s.update(new_scale)
    assert s.get_scale() == 8.0


def test_update_new_scale():
    s = cpu_scaler(init_scale=8.0)
    run_update(s, False)
    tracker = s._get_growth_tracker()
    s.update(3.0)
    assert s.get_scale() == 3.0 and s._get_growth_tracker() == tracker
    a = np.array([5.0], np.float32)
    s.update(a)
    a[0] = 7.0  # copied, not kept
    assert s.get_scale() == 5.0
    s.update(np.array(6, np.float64))
    assert s.get_scale() == 6.0


# ---------------------------------------------------------------------------
# End to end: control against scaled runs (_run_scaling_case)
# ---------------------------------------------------------------------------


def run_case(body, unskipped, skipped, momentum=0.0, pickle_each_iter=False):
    for enabled in (True, False):
        control, opt_c, scaled, opt_s, data = scaling_case(momentum=momentum)
        scaler = ampc.GradScaler("cpu", init_scale=128.0, growth_factor=2.0, growth_interval=1, enabled=enabled)
        for i, (x, t) in enumerate(data):
            control.loss_and_backward(x, t)
            if not enabled or i != SKIP_ITER:  # the disabled run never injects its inf
                opt_c.step()
            body(scaler, scaled, opt_s, x, t, i)
            if pickle_each_iter:
                scaler = pickle.loads(pickle.dumps(scaler))
        assert scaler.get_scale() == (128.0 * 2**unskipped * 0.5**skipped if enabled else 1.0)
        for a, b in zip(params_of(control), params_of(scaled)):
            np.testing.assert_array_equal(a, b)  # bit for bit: the scales are powers of two


def plain_body(scaler, model, opt, x, t, i):
    model.loss_and_backward(x, t, seed=scaler.scale(np.float32(1.0)))
    if i == SKIP_ITER and scaler.is_enabled():
        model.layers[1][0].grad[...] = np.inf
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("pickle_each_iter", [False, True])
def test_scaling_case(momentum, pickle_each_iter):
    run_case(plain_body, 3, 1, momentum=momentum, pickle_each_iter=pickle_each_iter)


@pytest.mark.parametrize("defer", [False, True])
def test_scaling_case_with_separate_unscale_and_fused_clipping(defer):
    """defer=True with an optimizer that does not take grad_scale itself clips at once,
    exactly as without it."""
    max_norm = 0.2

    def control_clip(model):
        grads = [p.grad for p in model.params()]
        norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
        coef = min(1.0, max_norm / (norm + 1e-6))
        for g in grads:
            g *= np.float32(coef)
        return norm

    for enabled in (True, False):
        control, opt_c, scaled, opt_s, data = scaling_case()
        scaler = ampc.GradScaler("cpu", init_scale=128.0, growth_interval=1, enabled=enabled)
        for i, (x, t) in enumerate(data):
            control.loss_and_backward(x, t)
            expected_norm = control_clip(control)
            if not enabled or i != SKIP_ITER:
                opt_c.step()
            scaled.loss_and_backward(x, t, seed=scaler.scale(np.float32(1.0)))
            if i == SKIP_ITER and enabled:
                scaled.layers[1][0].grad[...] = np.inf
            norm = scaler.unscale_(opt_s, max_norm=max_norm, defer=defer)
            assert isinstance(norm, np.ndarray) and norm.dtype == np.float32
            if i != SKIP_ITER or not enabled:
                assert float(norm) == pytest.approx(expected_norm, rel=1e-6)
            else:
                assert not np.isfinite(norm)
            scaler.step(opt_s)
            scaler.update()
        for a, b in zip(params_of(control), params_of(scaled)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # one rounding fused where the control has two


def test_defer_needs_max_norm_and_changes_nothing():
    g = np.full(3, 8.0, np.float32)
    opt = opt_with(g)
    s = cpu_scaler()
    with pytest.raises(ValueError, match="defer=True defers clipping and needs max_norm"):
        s.unscale_(opt, defer=True)
    np.testing.assert_array_equal(g, 8.0)
    s.unscale_(opt)  # still READY
    np.testing.assert_array_equal(g, 8.0 / 128)


def test_scaling_case_accumulation():
    for enabled in (True, False):
        control, opt_c, scaled, opt_s, data = scaling_case()
        scaler = ampc.GradScaler("cpu", init_scale=128.0, growth_interval=1, enabled=enabled)
        for i, (x, t) in enumerate(data):
            control.loss_and_backward(x, t, seed=np.float32(0.5), accumulate=i % 2 == 1)
            scaled.loss_and_backward(x, t, seed=scaler.scale(np.float32(0.5)), accumulate=i % 2 == 1)
            if i % 2 == 1:
                opt_c.step()
                scaler.step(opt_s)
                scaler.update()
        assert scaler.get_scale() == (128.0 * 2**2 if enabled else 1.0)
        for a, b in zip(params_of(control), params_of(scaled)):
            np.testing.assert_array_equal(a, b)


def test_scaling_case_multiple_models_and_optimizers():
    """test_grad_scaling_multiple: the inf in model 1 only; opt0 still steps at skip_iter."""
    c0, oc0, s0, os0, data = scaling_case(seed=1)
    c1, oc1, s1, os1, _ = scaling_case(seed=2)
    scaler = ampc.GradScaler("cpu", init_scale=128.0, growth_interval=1)
    for i, (x, t) in enumerate(data):
        for model in (c0, c1):
            model.loss_and_backward(x, t)
        oc0.step()
        if i != SKIP_ITER:
            oc1.step()
        seed = scaler.scale(np.float32(1.0))
        s0.loss_and_backward(x, t, seed=seed)
        s1.loss_and_backward(x, t, seed=seed)
        if i == SKIP_ITER:
            s1.layers[1][0].grad[...] = np.inf
        scaler.unscale_(os0)
        scaler.step(os0)
        scaler.step(os1)
        scaler.update()
    assert scaler.get_scale() == 128.0 * 2**3 * 0.5
    for control, scaled in ((c0, s0), (c1, s1)):
        for a, b in zip(params_of(control), params_of(scaled)):
            np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Optimizers that take grad_scale and found_inf themselves
# ---------------------------------------------------------------------------


def test_fused_optimizer_contract():
    s = cpu_scaler(init_scale=4.0)
    seen = {}

    class Fused(SGD):
        _step_supports_amp_scaling = True

        def step(self):
            seen["grad_scale"] = None if self.grad_scale is None else float(self.grad_scale)
            seen["found_inf"] = float(self.found_inf)

    opt = Fused([Param(np.zeros(2, np.float32))])
    g = np.array([8.0, np.inf], np.float32)
    opt.param_groups[0]["params"][0].grad = g
    retval, found = s.step(opt, return_found_inf=True)
    assert seen == {"grad_scale": 4.0, "found_inf": 1.0} and float(found) == 1.0
    assert not hasattr(opt, "grad_scale") and not hasattr(opt, "found_inf")
    assert g[0] == 8.0  # the check did not unscale: the optimizer does
    s.update()
    g[1] = 1.0
    s.scale(np.float32(1))
    s.unscale_(opt)
    s.step(opt)
    assert seen == {"grad_scale": None, "found_inf": 0.0}  # already unscaled: nothing more to divide


def test_fused_optimizer_legacy_contract():
    s = cpu_scaler()
    got = {}

    class Legacy(SGD):
        _step_supports_amp_scaling = True

        def step(self, grad_scaler=None):
            got["scaler"] = grad_scaler

    opt = Legacy([Param(np.zeros(2, np.float32))])
    opt.param_groups[0]["params"][0].grad = np.ones(2, np.float32)
    with pytest.warns(FutureWarning, match="stop passing itself"):
        assert s.step(opt, return_found_inf=True) == (None, False)
    assert got["scaler"] is s and not hasattr(opt, "grad_scale")


# ---------------------------------------------------------------------------
# state_dict and pickling
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("lazy", [True, False])
def test_state_dict(lazy):
    s0 = ampc.GradScaler("cpu", init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
    s1 = ampc.GradScaler("cpu", init_scale=6.0, growth_factor=7.0, backoff_factor=0.8, growth_interval=1)
    if not lazy:
        s0.scale(np.float32(1))
        s1.scale(np.float32(1))
    sd = s0.state_dict()
    assert sd == {"scale": 3.0, "growth_factor": 4.0, "backoff_factor": 0.5, "growth_interval": 2, "_growth_tracker": 0}
    s1.load_state_dict(json.loads(json.dumps(sd)))
    assert (s1.get_scale(), s1.get_growth_factor(), s1.get_backoff_factor(), s1.get_growth_interval(),
            s1._get_growth_tracker()) == (3.0, 4.0, 0.5, 2, 0)


@pytest.mark.parametrize(
    "change,error,match",
    [
        ({}, RuntimeError, "The source state dict is empty, possibly because it was saved from a disabled instance"),
        ("drop:scale", KeyError, "scale"),  # torch's KeyError; ampc.StateDictError is a ValueError too
        ("drop:_growth_tracker", ampc.StateDictError, "_growth_tracker"),
        ("drop:growth_factor", ValueError, "growth_factor"),
        ({"scale": "1"}, TypeError, "scale must be a number"),
        ({"scale": float("nan")}, ValueError, "positive finite"),
        ({"scale": -1.0}, ValueError, "positive finite"),
        ({"_growth_tracker": -3}, ValueError, "_growth_tracker"),
        ({"growth_interval": -1}, ValueError, "growth_interval must be >= 0"),
        ({"growth_factor": 0.5}, ValueError, r"growth_factor must be a finite number >= 1\.0"),
        ({"backoff_factor": 1.5}, ValueError, r"backoff_factor must be in \(0, 1\]"),
        ({"growth_interval": 2.0}, TypeError, "must be an int"),
    ],
)
def test_load_state_dict_errors_change_nothing(change, error, match):
    s = cpu_scaler(init_scale=8.0)
    before = s.state_dict()
    if change == {}:
        sd = {}
    elif isinstance(change, str):
        sd = dict(before)
        del sd[change.split(":")[1]]
    else:
        sd = {**before, **change}
    with pytest.raises(error, match=match):
        s.load_state_dict(sd)
    assert s.state_dict() == before


def test_options_appear_in_the_state_dict_only_when_used():
    s = ampc.GradScaler("cpu", init_scale=8.0, min_scale=1.0, max_scale=1024.0, hysteresis=2)
    sd = s.state_dict()
    assert (sd["min_scale"], sd["max_scale"], sd["hysteresis"]) == (1.0, 1024.0, 2)
    t = ampc.GradScaler("cpu")
    t.load_state_dict(sd)
    assert t.state_dict() == sd


def test_pickling():
    s = ampc.GradScaler("cpu", init_scale=3.0, growth_factor=4.0, backoff_factor=0.5, growth_interval=2)
    for lazy in (True, False):
        if not lazy:
            s.scale(np.float32(1))
        t = pickle.loads(pickle.dumps(s))
        assert t.is_enabled() and t.state_dict() == s.state_dict()
        assert t.scale(np.float32(4.0)) == 12.0
    s.unscale_(opt_with(np.ones(2, np.float32)))
    with pytest.raises(AssertionError, match="may only be pickled at the beginning of an iteration"):
        pickle.dumps(s)
    d = pickle.loads(pickle.dumps(ampc.GradScaler("cpu", enabled=False)))
    assert not d.is_enabled()


# ---------------------------------------------------------------------------
# Telemetry and overflow reports
# ---------------------------------------------------------------------------


def test_stats():
    s = ampc.GradScaler("cpu", init_scale=16.0, growth_interval=3)
    assert s.stats()["last_step_skipped"] is None and s.stats()["steps"] == 0
    run_update(s, False)
    run_update(s, True)
    st = s.stats()
    assert (st["steps"], st["skipped_steps"], st["scale"], st["growth_tracker"], st["last_step_skipped"]) == \
        (2, 1, 8.0, 0, True)
    run_update(s, False)
    assert s.stats()["last_step_skipped"] is False
    assert pickle.loads(pickle.dumps(s)).stats()["steps"] == 3


def test_overflow_report():
    s = cpu_scaler()
    model_grads = {"encoder.weight": np.ones((3, 4), np.float32), "encoder.bias": np.ones(4, ml_dtypes.bfloat16),
                   "head.weight": np.ones((2, 2), np.float64)}
    model_grads["encoder.weight"][1, :2] = [np.inf, np.nan]
    model_grads["head.weight"][0, 0] = -np.inf
    params = []
    for g in model_grads.values():
        p = Param(np.zeros_like(g))
        p.grad = g
        params.append(p)
    opt = SGD(params)
    names = list(zip(model_grads, params))
    report = s.overflow_report(opt, names=names)
    assert [(r["name"], r["nonfinite"], r["shape"], r["dtype"]) for r in report] == [
        ("encoder.weight", 2, (3, 4), "float32"), ("head.weight", 1, (2, 2), "float64")]
    assert s.overflow_report(opt)[0]["name"] == "param_groups[0]['params'][0]"
    assert s.overflow_report(opt, names=dict(names))[1]["name"] == "head.weight"


def test_no_reference_leaks():
    s = cpu_scaler()
    g = np.ones(100, np.float32)
    opt = opt_with(g)
    loss = np.float32(1.0)
    base = sys.getrefcount(g), sys.getrefcount(opt), sys.getrefcount(loss)
    for _ in range(500):
        s.scale(loss)
        s.unscale_(opt)
        s.step(opt)
        s.update()
        s.state_dict()
        s.overflow_report(opt)
        with pytest.raises(AssertionError):
            s.update()
    assert (sys.getrefcount(g), sys.getrefcount(opt), sys.getrefcount(loss)) == base


def test_legacy_cpu_free_names_are_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ampc.amp.GradScaler("cpu")
    assert ampc.amp.OptState.READY.value == 0 and ampc.amp.OptState.STEPPED.value == 2
