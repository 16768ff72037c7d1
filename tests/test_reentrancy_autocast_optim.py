"""Calls back into ampc.optim and autocast's regions from the Python they run themselves (issue 50,
the class "borrowed state across a call that can run Python"): a Parameter's .grad or .data
property, an optimizer's param_groups property, a hyperparameter's __float__, an __index__, an
array's __dlpack__, a data object's _version property, the functions of autocast ops, custom_fwd
and the tape's backward hooks. Each callback calls the public methods (optimizer.step, zero_grad,
load_state_dict, add_param_group, state_dict; a region's __enter__ / __exit__,
set_autocast_enabled, set_autocast_dtype, clear_autocast_cache). Whatever the callback does, the
result is no crash and a consistent state: an optimizer refuses a method that would change it
under its own step with a RuntimeError and changes nothing, or the call gives the result it would
give before or after."""

import numpy as np
import pytest

import ampc
from ampc import _C, optim
from ampc.nn import functional as F

F32, BF16 = np.dtype(np.float32), ampc.bfloat16
INSIDE_STEP = r"was called from inside its own step\(\)"


def nesting():
    depth = ampc.autocast_increment_nesting() - 1
    ampc.autocast_decrement_nesting()
    return depth


@pytest.fixture(autouse=True)
def no_region_left():
    yield
    assert nesting() == 0 and not ampc.is_autocast_enabled("cpu")
    assert _C._autocast_cache_info()["entries"] == 0


class Once:
    """A callback run the first time it is called (later calls do nothing): what it raised, and
    whether it ran, are kept."""

    def __init__(self, callback=None):
        self.callback, self.ran, self.error = callback, False, None

    def __call__(self):
        if self.callback is None or self.ran:
            return
        self.ran = True
        try:
            self.callback()
        except Exception as error:  # noqa: BLE001 - recorded, then raised again
            self.error = error
            raise


class HookedParameter(ampc.Parameter):
    """A Parameter whose .grad and .data run `hook` on every read (a property: arbitrary code)."""

    hook = Once()

    @property
    def grad(self):
        self.hook()
        return ampc.Parameter.grad.__get__(self)

    @grad.setter
    def grad(self, value):
        ampc.Parameter.grad.__set__(self, value)

    @property
    def data(self):
        self.hook()
        return ampc.Parameter.data.__get__(self)

    @data.setter
    def data(self, value):
        ampc.Parameter.data.__set__(self, value)


class DLPackArray:
    """An array of another library: its __dlpack__ (which ampc calls to read it) runs `hook` first."""

    def __init__(self, array, hook):
        self.array, self.hook = array, hook

    shape = property(lambda self: self.array.shape)
    dtype = property(lambda self: self.array.dtype)

    def __dlpack__(self, *args, **kwargs):
        self.hook()
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class Number:
    """A hyperparameter whose __float__ (and __index__) runs `hook`."""

    def __init__(self, value, hook):
        self.value, self.hook = value, hook

    def __float__(self):
        self.hook()
        return float(self.value)

    def __index__(self):
        self.hook()
        return int(self.value)


MAKERS = {
    "SGD": lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9),
    "Adam": lambda ps: optim.Adam(ps, lr=0.1),
    "AdamW amsgrad": lambda ps: optim.AdamW(ps, lr=0.1, amsgrad=True),
}


def setup(make, hook=None, n=3, kind=HookedParameter, seed=0):
    """An optimizer over n parameters (the hooked kind) that has stepped once, so that it has state."""
    rng = np.random.default_rng(seed)
    params = [kind(rng.standard_normal(4).astype(np.float32)) for _ in range(n)]
    for p in params:
        ampc.Parameter.grad.__set__(p, rng.standard_normal(4).astype(np.float32))
    HookedParameter.hook = Once()
    opt = make(params)
    opt.step()
    HookedParameter.hook = Once(hook)
    return opt, params


def snapshot(opt, params, grads=None):
    """Everything a step changes, copied: parameters, gradients (`grads`, if the parameters' are not
    arrays), state arrays, and the groups' settings. Read past any .data / .grad property."""
    if grads is None:
        grads = [ampc.Parameter.grad.__get__(p) for p in params]
    raw = [(np.array(ampc.Parameter.data.__get__(p)), np.array(g)) for p, g in zip(params, grads)]
    state = {i: {k: None if v is None else np.array(v) for k, v in opt.state.get(p, {}).items()}
             for i, p in enumerate(params)}
    groups = [dict(g, params=len(g["params"])) for g in opt.__dict__["param_groups"]]
    return raw, state, groups


def assert_same(a, b):
    (raw_a, state_a, groups_a), (raw_b, state_b, groups_b) = a, b
    for (pa, ga), (pb, gb) in zip(raw_a, raw_b):
        np.testing.assert_array_equal(pa, pb)
        np.testing.assert_array_equal(ga, gb)
    assert state_a.keys() == state_b.keys()
    for i in state_a:
        assert state_a[i].keys() == state_b[i].keys()
        for k in state_a[i]:
            np.testing.assert_array_equal(state_a[i][k], state_b[i][k])
    assert groups_a == groups_b


def reference_after_two_steps(make, n=3):
    """The parameters a plain optimizer has after two steps from setup()'s start."""
    opt, params = setup(make, kind=ampc.Parameter, n=n)
    opt.step()
    return [np.array(p.data) for p in params]


def mutators(opt):
    """The public methods that change an optimizer, each as the callback calls it."""
    saved = opt.state_dict()
    extra = ampc.Parameter(np.ones(4, np.float32))
    return {
        "step": lambda: opt.step(),
        "zero_grad": lambda: opt.zero_grad(),
        "zero_grad(set_to_none=False)": lambda: opt.zero_grad(set_to_none=False),
        "load_state_dict": lambda: opt.load_state_dict(saved),
        "add_param_group": lambda: opt.add_param_group({"params": [extra]}),
    }


MUTATOR_NAMES = ["step", "zero_grad", "zero_grad(set_to_none=False)", "load_state_dict", "add_param_group"]


# ---------------------------------------------------------------------------------------------
# Optimizers: a method that would change the optimizer, called from inside its step, is refused
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MUTATOR_NAMES)
@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_grad_property_calling_back_during_step(make, name):
    opt, params = setup(make)
    HookedParameter.hook = Once(mutators(opt)[name])
    before = snapshot(opt, params)
    with pytest.raises(RuntimeError, match=INSIDE_STEP):
        opt.step()
    assert HookedParameter.hook.ran and isinstance(HookedParameter.hook.error, RuntimeError)
    assert_same(snapshot(opt, params), before)  # the refused step changed nothing
    HookedParameter.hook = Once()
    opt.step()  # and the optimizer steps as if nothing had happened
    for p, expected in zip(params, reference_after_two_steps(make)):
        np.testing.assert_array_equal(ampc.Parameter.data.__get__(p), expected)


@pytest.mark.parametrize("name", MUTATOR_NAMES)
@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_dlpack_of_a_gradient_calling_back_during_step(make, name):
    # __dlpack__ runs inside _C._sgd_step / _C._adam_step, while it reads the arrays
    opt, params = setup(make, kind=ampc.Parameter)
    hook = Once(mutators(opt)[name])
    grads = [p.grad for p in params]
    params[1].grad = DLPackArray(grads[1], hook)
    before = snapshot(opt, params, grads)
    with pytest.raises(RuntimeError, match=INSIDE_STEP):
        opt.step()
    assert hook.ran
    assert_same(snapshot(opt, params, grads), before)
    opt.step()
    for p, expected in zip(params, reference_after_two_steps(make)):
        np.testing.assert_array_equal(p.data, expected)


@pytest.mark.parametrize("name", MUTATOR_NAMES)
@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_float_of_a_setting_calling_back_during_step(make, name):
    opt, params = setup(make, kind=ampc.Parameter)
    hook = Once(mutators(opt)[name])
    opt.param_groups[0]["lr"] = Number(0.1, hook)
    before = snapshot(opt, params)
    with pytest.raises(RuntimeError, match=INSIDE_STEP):
        opt.step()
    assert hook.ran
    assert_same(snapshot(opt, params), before)
    opt.step()
    for p, expected in zip(params, reference_after_two_steps(make)):
        np.testing.assert_array_equal(p.data, expected)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_param_groups_property_calling_back(make):
    calls = []

    class Hooked(type(make([ampc.Parameter(np.ones(1, np.float32))]))):
        hook = Once()

        @property
        def param_groups(self):
            self.hook()
            return self.__dict__["param_groups"]

        @param_groups.setter
        def param_groups(self, value):
            self.__dict__["param_groups"] = value

    opt, params = setup(lambda ps: Hooked(ps, lr=0.1), kind=ampc.Parameter)
    saved = opt.state_dict()
    for call in (lambda: opt.load_state_dict(saved), opt.step, opt.zero_grad):
        before = snapshot(opt, params)
        Hooked.hook = hook = Once(call)
        with pytest.raises(RuntimeError, match=INSIDE_STEP):
            opt.step()
        Hooked.hook = Once()
        assert_same(snapshot(opt, params), before)
        calls.append(hook.ran)
    # outside a step, the same callbacks are fine: zero_grad reading param_groups steps first
    Hooked.hook = Once(opt.step)
    opt.zero_grad()
    assert Hooked.hook.ran and all(p.grad is None for p in params) and calls == [True] * 3
    expected = reference_after_two_steps(lambda ps: type(make(ps))(ps, lr=0.1))
    for p, e in zip(params, expected):
        np.testing.assert_array_equal(p.data, e)


@pytest.mark.parametrize("make", MAKERS.values(), ids=MAKERS.keys())
def test_state_dict_from_inside_a_step_is_a_consistent_snapshot(make):
    opt, params = setup(make)
    seen = {}
    HookedParameter.hook = Once(lambda: seen.setdefault("state", opt.state_dict()))
    opt.step()  # reading is allowed: the step runs
    assert seen["state"]["state"].keys() == {0, 1, 2}
    HookedParameter.hook = Once()
    for p, expected in zip(params, reference_after_two_steps(make)):
        np.testing.assert_array_equal(ampc.Parameter.data.__get__(p), expected)


def test_closure_may_call_zero_grad_and_step_elsewhere():
    # step(closure) runs the closure before its guard: the usual closure zeroes the gradients
    opt, params = setup(MAKERS["SGD"], kind=ampc.Parameter)
    other, _ = setup(MAKERS["Adam"], kind=ampc.Parameter, seed=1)

    def closure():
        opt.zero_grad(set_to_none=False)
        other.step()  # another optimizer is free to step
        for p in params:
            p.grad = np.ones(4, np.float32)
        return 1.5

    assert opt.step(closure) == 1.5


def test_other_threads_are_not_refused():
    import threading

    opt, params = setup(MAKERS["SGD"])
    done = []
    HookedParameter.hook = Once(lambda: (t := threading.Thread(target=lambda: done.append(opt.state_dict())),
                                         t.start(), t.join()))
    opt.step()
    assert len(done) == 1


def test_index_of_a_shape_calling_back():
    # zeros_like's shape entries are read with __index__, with x's view held
    x = np.ones((2, 3), np.float32)
    opt, params = setup(MAKERS["SGD"], kind=ampc.Parameter)

    def callback():
        del params[:]
        opt.step()

    out = _C.zeros_like(x, shape=[Number(4, Once(callback)), 2])
    assert out.shape == (4, 2) and not out.any()


# ---------------------------------------------------------------------------------------------
# Autocast: regions and the cache, from the Python an autocast op runs
# ---------------------------------------------------------------------------------------------


class VersionedData(DLPackArray):
    """Data with a version counter of its own (a torch tensor's _version), read by the weight-cast
    cache: a property, so it may run anything."""

    version_hook = Once()

    @property
    def _version(self):
        self.version_hook()
        return 0


def _enter_and_leave_a_region(region):
    nested = ampc.autocast("cpu", dtype=np.float16)
    nested.__enter__()
    nested.__exit__(None, None, None)


REGION_CALLBACKS = {
    "clear_autocast_cache": lambda region: ampc.clear_autocast_cache(),
    "set_autocast_enabled off": lambda region: ampc.set_autocast_enabled("cpu", False),
    "set_autocast_dtype": lambda region: ampc.set_autocast_dtype("cpu", np.float16),
    "set_autocast_cache_enabled off": lambda region: ampc.set_autocast_cache_enabled(False),
    "a region entered and left": _enter_and_leave_a_region,
    "the op's own region left": lambda region: region.__exit__(None, None, None),
}

# The dtype the op's arrays get. _version is read while a cast is made, after the op's dtype was
# chosen: always the region's. __dlpack__ is called while the arguments are read, before: a region
# turned off or left casts nothing (the data object itself is handed on), another dtype is used.
EXPECTED = {("_version", name): BF16 for name in REGION_CALLBACKS}
EXPECTED.update({("__dlpack__", name): BF16 for name in REGION_CALLBACKS})
EXPECTED.update({("__dlpack__", "set_autocast_enabled off"): None, ("__dlpack__", "the op's own region left"): None,
                 ("__dlpack__", "set_autocast_dtype"): np.dtype(np.float16)})


@pytest.mark.parametrize("name", REGION_CALLBACKS)
@pytest.mark.parametrize("where", ["_version", "__dlpack__"])
def test_autocast_callbacks_calling_back(name, where):
    # The cache's lookup held its entry borrowed across the _version read: a property that cleared
    # the cache made it hand out a freed cast (AddressSanitizer: heap-use-after-free in Py_INCREF).
    op = ampc.AutocastOp(lambda a, b: (a, b), "mm")
    raw = np.random.default_rng(5).standard_normal((4, 4)).astype(np.float32)
    data = VersionedData(raw, Once())
    p = ampc.Parameter(data)
    region = ampc.autocast("cpu")
    expected = EXPECTED[where, name]
    region.__enter__()
    left = False
    try:
        op(p, p)  # cast and cached
        for _ in range(3):
            ampc.set_autocast_enabled("cpu", True)
            ampc.set_autocast_dtype("cpu", BF16)
            ampc.set_autocast_cache_enabled(True)
            hook = Once(lambda: REGION_CALLBACKS[name](region))
            if where == "_version":
                VersionedData.version_hook = hook
            else:
                data.hook = hook
            got = op(p, p)
            VersionedData.version_hook, data.hook = Once(), Once()
            assert hook.ran and hook.error is None
            for a in got:
                if expected is None:
                    assert a is data
                else:
                    assert np.asarray(a).dtype == expected
                    np.testing.assert_array_equal(np.asarray(a), np.asarray(ampc.cast(raw, expected)))
            if name == "the op's own region left":
                left = True
                break
    finally:
        VersionedData.version_hook = Once()
        if not left:
            region.__exit__(None, None, None)
    assert nesting() == 0 and _C._autocast_cache_info()["entries"] == 0


def test_parameter_given_other_data_by_dlpack_is_cast_as_it_is_now():
    # scan() held a Parameter's data borrowed across __dlpack__, which here replaces it (the old
    # data's last reference): the op gets the new data's cast, or the old one's, never freed memory
    mm = ampc.AutocastOp(lambda a: a, "mm")
    old, new = np.full(4, 2.0, np.float32), np.full(4, 3.0, np.float32)
    p = ampc.Parameter(np.zeros(1, np.float32))
    p.data = DLPackArray(old, Once(lambda: setattr(p, "data", new)))
    with ampc.autocast("cpu"):
        out = np.asarray(mm(p)).astype(np.float32)
        again = np.asarray(mm(p)).astype(np.float32)
    assert out.tolist() in ([2.0] * 4, [3.0] * 4) and again.tolist() == [3.0] * 4
    assert p.data is new


def test_container_emptied_by_dlpack_during_the_scan():
    # an argument list cleared by __dlpack__ of one of its items while the op's arguments are read
    seen = []
    op = ampc.AutocastOp(lambda xs: seen.append([np.asarray(x).dtype for x in xs]) or xs, "mm")
    items = []
    items += [DLPackArray(np.ones(3, np.float32), Once(lambda: items.clear())),
              np.ones(3, np.float32), ampc.Parameter(np.ones(3, np.float32))]
    with ampc.autocast("cpu"):
        out = op(items)
    assert seen == [[]] and out == []  # the list as it is when the op runs


def test_op_function_leaving_the_region_it_runs_in():
    # The op's function leaves the region the call was made in. The count of autocast ops running
    # was counted down after the call, to -1: autocast stayed off on the thread (outside regions,
    # which reset it) even where set_autocast_enabled turned it on.
    region = ampc.autocast("cpu")
    op = ampc.AutocastOp(lambda a: region.__exit__(None, None, None) or a, "mm")
    plain = ampc.AutocastOp(lambda a: a, "mm")
    x = np.ones((2, 2), np.float32)
    region.__enter__()
    assert np.asarray(op(x)).dtype == BF16
    assert not ampc.is_autocast_enabled("cpu") and nesting() == 0
    ampc.set_autocast_enabled("cpu", True)
    try:
        assert np.asarray(plain(x)).dtype == BF16  # was float32
    finally:
        ampc.set_autocast_enabled("cpu", False)
        ampc.clear_autocast_cache()


class EagerName(str):
    """An op name whose comparisons run Python: exiting a region mid-lookup would free the dict
    being searched."""

    calls = []
    __hash__ = str.__hash__

    def __eq__(self, other):
        EagerName.calls.append(other)
        return str.__eq__(self, other)


def test_op_names_are_plain_str_so_lookups_run_no_python():
    # a region's policies by name (fp32_ops=) were kept under the caller's str subclass: each op's
    # lookup in them ran its __eq__, which may leave the region and free the dict being searched
    x = np.ones((2, 2), np.float32)
    mm = ampc.AutocastOp(lambda a: a, "mm")
    region = ampc.autocast("cpu", fp32_ops=[EagerName("mm")])
    EagerName.calls = []
    with region:
        assert np.asarray(mm(x)).dtype == F32  # the override holds
        assert np.asarray(mm(ampc.cast(x, BF16))).dtype == F32
        with ampc.autocast("cpu", lower_precision_ops=["exp"]):  # merged with the outer ones
            assert np.asarray(mm(ampc.cast(x, BF16))).dtype == F32
    assert EagerName.calls == []
    # the registry keeps plain str too
    op = ampc.AutocastOp(lambda a: a, EagerName("reentrancy_test_op"))
    assert type(op.name) is str
    ampc.register_autocast(EagerName("reentrancy_test_op"), "fp32", "cpu")
    EagerName.calls = []
    try:
        with ampc.autocast("cpu"):
            assert np.asarray(op(ampc.cast(x, BF16))).dtype == F32
        assert EagerName.calls == []
    finally:
        ampc.register_autocast("reentrancy_test_op", "none")


def test_custom_fwd_and_bwd_bodies_calling_back():
    class Ctx:
        pass

    outer = ampc.autocast("cpu")

    @ampc.custom_fwd(device_type="cpu", cast_inputs=np.float32)
    def forward(ctx, x):
        ampc.set_autocast_enabled("cpu", True)  # inside custom_fwd's disabled region
        ampc.clear_autocast_cache()
        outer.__exit__(None, None, None)  # the caller's region, left from inside
        return x

    @ampc.custom_bwd(device_type="cpu")
    def backward(ctx, g):
        with ampc.autocast("cpu", dtype=np.float16):
            return g

    outer.__enter__()
    ctx = Ctx()
    out = forward(ctx, ampc.cast(np.ones(2), BF16))
    assert out.dtype == F32
    assert backward(ctx, out) is out
    assert nesting() == 0 and not ampc.is_autocast_enabled("cpu")


def test_tape_backward_hooks_calling_the_optimizer():
    from ampc import autograd

    rng = np.random.default_rng(9)
    w = ampc.Parameter(rng.standard_normal(3).astype(np.float32))
    opt = optim.SGD([w], lr=0.5)
    calls = []

    class Owner:
        def hook(self, params):
            calls.append([id(p) for p in params])
            opt.step()
            opt.zero_grad()

    owner = Owner()
    handle = autograd.register_post_backward_hook(owner.hook)
    try:
        before = np.array(w.data)
        F.sum(F.mul(w, 2.0)).backward()
        assert calls == [[id(w)]] and w.grad is None
        np.testing.assert_array_equal(w.data, before - np.float32(0.5) * np.float32(2.0))
    finally:
        handle.remove()


class StepOnGrad(ampc.Parameter):
    """A Parameter whose .grad setter (run by backward() as it writes the gradient) runs `hook`."""

    hook = Once()

    @property
    def grad(self):
        return ampc.Parameter.grad.__get__(self)

    @grad.setter
    def grad(self, value):
        ampc.Parameter.grad.__set__(self, value)
        if value is not None:
            self.hook()


def test_grad_setter_stepping_a_parameter_a_later_node_reads():
    # backward() checked the saved Parameters' versions once, before it ran: an optimizer stepped
    # from a .grad setter in the middle went unseen, and the next node read the new values (w.grad
    # came out [-197, -195, -193], not [3, 5, 7]). torch checks a saved tensor as it is unpacked.
    w = ampc.Parameter(np.array([1.0, 2.0, 3.0], np.float32))
    v = StepOnGrad(np.ones(3, np.float32))
    opt = optim.SGD([w], lr=100.0)
    w.grad = np.ones(3, np.float32)
    loss = F.sum(F.mul(F.mul(w, w), v))  # mul(w, w)'s backward reads w, after mul(., v)'s wrote v.grad
    StepOnGrad.hook = Once(opt.step)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation: \[Parameter \(3,\)\] is at version 1"):
        loss.backward()
    assert StepOnGrad.hook.ran
    np.testing.assert_array_equal(w.grad, np.ones(3, np.float32))  # not written from stale values
    StepOnGrad.hook = Once()
