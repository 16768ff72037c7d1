"""GradScaler re-entered from every place it runs the caller's code (issue 50's harness).

At each callback point of the scaler (an optimizer's param_groups, a parameter's .grad, a
gradient's __dlpack__ and __dlpack_device__, optimizer.step of a plain and of a fused optimizer,
its __setattr__ and _step_supports_amp_scaling, a loss's and a new_scale's __dlpack__, a state
dict's __float__ and a pickle's __index__, return_found_inf's __bool__), the hook calls back into
every public method once. Whatever happens, the interpreter lives (under AddressSanitizer and
valgrind in CI, memory errors fail too), a re-entered method either works or raises a clear
exception (RuntimeError when it is refused), the outer call returns or raises, and the scaler is
left consistent: its state dict loads into a fresh scaler, and a clean iteration afterwards gives
exactly what the fresh scaler gives. Where the hook runs while the scaler reads the optimizer
(param_groups, .grad, __dlpack__), the refusals also keep the gradients unscaled exactly once."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

import ampc

SCALE = 4.0
GRAD = np.array([8.0, -4.0], np.float32)


class Hook:
    """Calls `probe` the first time it fires; records what the probe raised."""

    def __init__(self):
        self.probe, self.errors, self.fired = None, [], False

    def __call__(self):
        if self.fired or self.probe is None:
            return
        self.fired = True
        try:
            self.probe()
        except Exception as error:  # noqa: BLE001 - every error is checked below
            self.errors.append(error)


class HookedArray:
    """A DLPack producer over a NumPy array whose export calls the hook."""

    def __init__(self, array, hook, where):
        self.array, self.hook, self.where = array, hook, where

    def __dlpack_device__(self):
        if self.where == "__dlpack_device__":
            self.hook()
        return self.array.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        if self.where == "__dlpack__":
            self.hook()
        return self.array.__dlpack__(**kwargs)


class HookedFloat:
    """A number that is not a float: reading it runs __float__."""

    def __init__(self, value, hook):
        self.value, self.hook = value, hook

    def __float__(self):
        self.hook()
        return self.value


class HookedIndex:
    def __init__(self, value, hook):
        self.value, self.hook = value, hook

    def __index__(self):
        self.hook()
        return self.value


class HookedBool:
    def __init__(self, hook):
        self.hook = hook

    def __bool__(self):
        self.hook()
        return True


class Param:
    def __init__(self, grad, hook=None):
        self._grad, self.hook, self.data = grad, hook, np.zeros(2, np.float32)

    @property
    def grad(self):
        if self.hook is not None:
            self.hook()
        return self._grad

    @grad.setter
    def grad(self, value):
        self._grad = value


class Optimizer:
    """A plain optimizer (or, with fused=True, one that takes grad_scale and found_inf) with hooks."""

    def __init__(self, params, hook=None, where=None, fused=False):
        object.__setattr__(self, "_hook", hook if where in ("param_groups", "step", "__setattr__",
                                                            "_step_supports_amp_scaling") else None)
        object.__setattr__(self, "_where", where)
        object.__setattr__(self, "_fused", fused)
        object.__setattr__(self, "_groups", [{"params": params}])
        object.__setattr__(self, "steps", 0)

    def _fire(self, where):
        if self._where == where and self._hook is not None:
            self._hook()

    @property
    def param_groups(self):
        self._fire("param_groups")
        return self._groups

    @property
    def _step_supports_amp_scaling(self):
        self._fire("_step_supports_amp_scaling")
        return self._fused

    def __setattr__(self, name, value):
        self._fire("__setattr__")
        object.__setattr__(self, name, value)

    def step(self):
        self._fire("step")
        object.__setattr__(self, "steps", self.steps + 1)


def fresh_grads():
    return [(GRAD * SCALE).astype(np.float32), (GRAD * SCALE).astype(np.float32)]


def other_optimizer():
    return Optimizer([Param(g) for g in fresh_grads()])


def probes(s, ctx):
    """Every public method of the scaler, as a hook would call it."""
    return {
        "scale": lambda: s.scale(np.float32(2)),
        "unscale_(other)": lambda: s.unscale_(other_optimizer()),
        "unscale_(same)": lambda: s.unscale_(ctx.opt),
        "unscale_(other, max_norm)": lambda: s.unscale_(other_optimizer(), max_norm=1.0),
        "step(other)": lambda: s.step(other_optimizer()),
        "step(same)": lambda: s.step(ctx.opt),
        "update": s.update,
        "update(new_scale)": lambda: s.update(8.0),
        "get_scale": s.get_scale,
        "_get_growth_tracker": s._get_growth_tracker,
        "state_dict": s.state_dict,
        "load_state_dict": lambda: s.load_state_dict({"scale": 2.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                                      "growth_interval": 3, "_growth_tracker": 1}),
        "stats": s.stats,
        "overflow_report": lambda: s.overflow_report(ctx.opt),
        "_check_inf_per_device(other)": lambda: s._check_inf_per_device(other_optimizer()),
        "_found_inf_per_device": lambda: s._found_inf_per_device(ctx.opt),
        "__getstate__": s.__getstate__,
        "__setstate__": lambda: s.__setstate__(ampc.GradScaler("cpu", init_scale=2.0).__getstate__()),
        "__init__": lambda: s.__init__("cpu", init_scale=2.0),
        "set_growth_factor": lambda: s.set_growth_factor(3.0),
    }


PROBES = list(probes(ampc.GradScaler("cpu"), None))

# Where the scaler reads the optimizer's gradients (the refusals keep them unscaled once) ...
READING_POINTS = ["param_groups", ".grad", "__dlpack__", "__dlpack_device__"]
READING_CALLS = ["unscale_", "step", "_check_inf_per_device", "unscale_(max_norm)", "overflow_report"]
# ... and the rest: (point, the call that reaches it).
OTHER_POINTS = [("step", "step"), ("step", "fused step"), ("__setattr__", "fused step"),
                ("_step_supports_amp_scaling", "fused step"), ("scale __dlpack__", "scale"),
                ("state dict __float__", "load_state_dict"), ("new_scale __dlpack__", "update(new_scale)"),
                ("pickle __index__", "__setstate__"), ("return_found_inf __bool__", "step")]
CASES = [(p, c) for p, c in itertools.product(READING_POINTS, READING_CALLS)] + OTHER_POINTS


def build(point, call, hook):
    """The optimizer, its gradients (the arrays the scaler will unscale) and the outer call."""
    grads = fresh_grads()
    fused = call == "fused step"
    if point in (".grad",):
        params = [Param(grads[0], hook), Param(grads[1])]
    elif point in ("__dlpack__", "__dlpack_device__"):
        params = [Param(HookedArray(grads[0], hook, point)), Param(grads[1])]
    else:
        params = [Param(g) for g in grads]
    opt = Optimizer(params, hook, point, fused=fused)
    return opt, grads


def outer_call(s, opt, point, call, hook):
    if call in ("unscale_", "step", "_check_inf_per_device", "overflow_report"):
        if point == "return_found_inf __bool__":
            return s.step(opt, return_found_inf=HookedBool(hook))
        return getattr(s, call)(opt)
    if call == "unscale_(max_norm)":
        return s.unscale_(opt, max_norm=100.0)
    if call == "fused step":
        return s.step(opt)
    if call == "scale":
        return s.scale(HookedArray(np.array(3.0, np.float32), hook, "__dlpack__"))
    if call == "load_state_dict":
        return s.load_state_dict({"scale": HookedFloat(8.0, hook), "growth_factor": 2.0, "backoff_factor": 0.5,
                                  "growth_interval": 5, "_growth_tracker": 0})
    if call == "update(new_scale)":
        return s.update(HookedArray(np.array(16.0, np.float32), hook, "__dlpack__"))
    if call == "__setstate__":
        state = ampc.GradScaler("cpu", init_scale=8.0).__getstate__()
        return s.__setstate__({**state, "growth_interval": HookedIndex(5, hook)})
    raise AssertionError(call)


def clean_iteration(s):
    """scale, step and update on fresh gradients: (the unscaled gradients, steps, state dict after)."""
    opt = other_optimizer()
    s.scale(np.float32(1))
    s.step(opt)
    s.update()
    grads = [p.grad for p in opt._groups[0]["params"]]
    return grads, opt.steps, s.state_dict()


@pytest.mark.parametrize("probe", PROBES)
@pytest.mark.parametrize("point,call", CASES, ids=[f"{p}-{c}" for p, c in CASES])
def test_every_method_from_every_callback(point, call, probe):
    s = ampc.GradScaler("cpu", init_scale=SCALE, growth_interval=2)
    s.scale(np.float32(1))
    hook = Hook()
    opt, grads = build(point, call, hook)
    hook.probe = probes(s, SimpleNamespace(opt=opt))[probe]
    try:
        outer_call(s, opt, point, call, hook)
        outer_error = None
    except Exception as error:  # noqa: BLE001
        outer_error = error
    assert hook.fired, "the callback point was not reached"
    for error in hook.errors + ([outer_error] if outer_error else []):
        assert isinstance(error, (RuntimeError, AssertionError, ValueError)), repr(error)
        assert str(error), repr(error)
        assert not isinstance(error, (SystemError, NotImplementedError)), repr(error)
    refused = [e for e in hook.errors if isinstance(e, RuntimeError) and "was called while GradScaler" in str(e)]
    if point in READING_POINTS and call in ("unscale_", "step") and outer_error is None:
        # read-time refusals: the outer call unscaled each gradient exactly once
        if probe in ("update", "unscale_(same)", "step(same)", "__init__", "__setstate__", "load_state_dict",
                     "update(new_scale)", "unscale_(other)", "unscale_(other, max_norm)", "step(other)",
                     "_check_inf_per_device(other)"):
            assert refused, (probe, hook.errors)
        for g in grads:
            np.testing.assert_array_equal(g, GRAD)

    # Consistent afterwards: finish the iteration, then a clean one matches a fresh scaler's.
    try:
        s.update()
    except AssertionError as error:  # nothing recorded since the last update, or a reset: torch's assertions
        assert "No inf checks were recorded" in str(error) or "_scale is None" in str(error)
    if not s.is_enabled():
        return
    sd = s.state_dict()
    twin = ampc.GradScaler("cpu")
    twin.load_state_dict(sd)
    assert twin.state_dict() == sd
    mine, theirs = clean_iteration(s), clean_iteration(twin)
    for a, b in zip(mine[0], theirs[0]):
        np.testing.assert_array_equal(a, b)
    assert mine[1:] == theirs[1:] and mine[1] == 1
