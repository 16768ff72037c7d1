"""GradScaler under hostile use (issue 50): what a caller's own code can do to the scaler from
inside its methods (a property, an optimizer's step), what a restored state may hold, how deep a
nesting goes, and what a returned array may alias. Each test fails on the defect it names."""

import copy
import pickle
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest

import ampc
import ampc.distributed as dist
from scaling_case import SGD, Param


def grads_opt(*values, step=None):
    params = [SimpleNamespace(grad=np.array(v, np.float32)) for v in values]
    opt = SimpleNamespace(param_groups=[{"params": params}])
    opt.step = step or (lambda: None)
    return opt


def scaler(init_scale=4.0, **kw):
    s = ampc.GradScaler("cpu", init_scale=init_scale, **kw)
    s.scale(np.float32(1))
    return s


# -- 1. recursion ---------------------------------------------------------------------------------

def test_a_list_that_holds_itself_raises_recursion_error():
    outputs = [np.float32(1)]
    outputs.append(outputs)
    with pytest.raises(RecursionError):
        ampc.GradScaler("cpu").scale(outputs)


def test_a_million_nested_tuples_raise_recursion_error():
    nested = np.float32(1)
    for _ in range(10**6):
        nested = (nested,)
    with pytest.raises(RecursionError):
        ampc.GradScaler("cpu").scale(nested)
    # deep enough to be real, shallow enough for the interpreter: scaled as torch scales it
    shallow = np.float32(3)
    for _ in range(50):
        shallow = [shallow]
    out = ampc.GradScaler("cpu", init_scale=2.0).scale(shallow)
    for _ in range(50):
        assert isinstance(out, list) and len(out) == 1
        out = out[0]
    assert out == np.float32(6)


def test_a_list_changed_while_it_is_scaled():
    """An output's __dlpack_device__ empties the list being scaled: every item read was held."""
    items = []

    class Shrinks:
        def __init__(self, value):
            self.array = np.array(value, np.float32)

        def __dlpack_device__(self):
            items.clear()
            return (1, 0)

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

    items.extend([Shrinks(1.0), Shrinks(2.0), Shrinks(3.0)])
    out = ampc.GradScaler("cpu", init_scale=2.0).scale(items)
    assert [float(np.asarray(v)) for v in out] == [2.0, 4.0, 6.0]


class Claims:
    """A float32 scalar in CPU memory whose __dlpack_device__ answers `device`."""

    def __init__(self, device):
        self.array, self.device = np.array(3.0, np.float32), device

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kwargs):
        return self.array.__dlpack__(**kwargs)


@pytest.mark.parametrize("device,match", [
    ("cpu", r"__dlpack_device__\(\) must return"),  # SystemError before (PyArg_ParseTuple on a str)
    ((1,), r"__dlpack_device__\(\) must return"),  # TypeError before
    ((1, 2**40), r"__dlpack_device__\(\) must return"),  # OverflowError before
    ((4, 0), "scale: outputs: DLPack device type 4 is not supported"),  # scaled as CPU memory before
    ((2, -1), "scale: outputs: DLPack device id -1 is negative"),  # a crash before, without ampc._cuda
], ids=["str", "1-tuple", "huge id", "OpenCL", "negative id"])
def test_scale_reads_the_device_as_dlpack_import_does(device, match):
    """scale() read __dlpack_device__ with its own parse (any type but 2 and 13 was the CPU, ids
    unchecked); it now shares dlpack.c's, whose errors ampc.cast gives for the same object."""
    s = ampc.GradScaler("cpu", init_scale=4.0)
    with pytest.raises(BufferError, match=match):
        s.scale(Claims(device))
    with pytest.raises(BufferError, match=match.replace("scale: outputs", "x")):
        ampc.cast(Claims(device), np.float16)
    assert s.scale(np.float32(1)) == 4.0


@pytest.mark.skipif(ampc.cuda.is_available(), reason="the check refuses only where ampc has no GPU")
@pytest.mark.parametrize("device", [(2, 0), (13, 0)])
def test_scale_of_an_output_on_a_gpu_ampc_cannot_use(device):
    """Before: the scale's memory was allocated on that GPU through ampc._cuda's table, which was
    never loaded (a NULL pointer call: segmentation fault)."""
    s = ampc.GradScaler("cpu", init_scale=4.0)
    with pytest.raises(RuntimeError, match="CUDA"):
        s.scale(Claims(device))
    assert s.scale(np.float32(1)) == 4.0
    with pytest.raises(RuntimeError, match="CUDA"):  # AssertionError (wrong device) before
        s.update(Claims(device))
    assert s.get_scale() == 4.0


# -- 2, 3. re-entrant calls -----------------------------------------------------------------------

def test_an_optimizer_whose_step_calls_update():
    """Before: Scaler_step wrote to the per-optimizer state that update() had freed (valgrind:
    invalid write), and another optimizer then read "step() has already been called"."""
    s = scaler()
    opt = grads_opt([4.0, 8.0], step=lambda: s.update())
    assert s.step(opt) is None
    np.testing.assert_array_equal(opt.param_groups[0]["params"][0].grad, [1.0, 2.0])
    with pytest.raises(AssertionError, match="No inf checks were recorded prior to update"):
        s.update()  # the optimizer's update() consumed this step's checks, as torch's would
    other = grads_opt([4.0])
    s.scale(np.float32(1))
    s.step(other)  # a fresh iteration: READY again, not "already been called"
    s.update()
    np.testing.assert_array_equal(other.param_groups[0]["params"][0].grad, [1.0])
    assert s.get_scale() == 4.0 and s._get_growth_tracker() == 2


def test_a_grad_property_that_calls_the_scaler_back():
    """Before: unscale_grads wrote into the freed states dict, then a PyCapsule error, then a
    segfault at exit. The re-entered update()/unscale_() are refused (RuntimeError from inside the
    property, which unscale_ passes on), scale() and the reads go through, and nothing changed."""
    s = scaler()
    other = grads_opt([8.0])
    seen = []

    class Hostile:
        @property
        def grad(self):
            for name, call in [("update", s.update), ("unscale_", lambda: s.unscale_(other)),
                               ("step", lambda: s.step(other)), ("init", lambda: s.__init__("cpu")),
                               ("setstate", lambda: s.__setstate__(ampc.GradScaler("cpu").__getstate__())),
                               ("load", lambda: s.load_state_dict(ampc.GradScaler("cpu").state_dict()))]:
                with pytest.raises(RuntimeError, match=r"GradScaler\.\w+\(\) was called while GradScaler\.unscale_"):
                    call()
                seen.append(name)
            seen.append(float(np.asarray(s.scale(np.float32(3)))))
            seen.append(s.get_scale())
            return np.array([4.0], np.float32)

    opt = SimpleNamespace(param_groups=[{"params": [Hostile()]}], step=lambda: None)
    assert s.unscale_(opt) is None
    assert seen == ["update", "unscale_", "step", "init", "setstate", "load", 12.0, 4.0]
    s.step(opt)
    s.update()
    assert s.get_scale() == 4.0 and s._get_growth_tracker() == 1
    s.scale(np.float32(1))
    s.unscale_(other)  # the refused unscale_ left no trace
    np.testing.assert_array_equal(other.param_groups[0]["params"][0].grad, [2.0])


def test_update_from_inside_a_fused_optimizers_step():
    """A fused optimizer (grad_scale and found_inf handed over) whose step calls update(): the
    step's found_inf is its own array, the state it leaves is that of a finished iteration."""
    s = scaler()
    got = {}

    class Fused:
        _step_supports_amp_scaling = True

        def __init__(self):
            self.param_groups = [{"params": [SimpleNamespace(grad=np.array([8.0], np.float32))]}]

        def step(self):
            got["found_inf"], got["grad_scale"] = self.found_inf, self.grad_scale
            s.update()
            s.__setstate__(ampc.GradScaler("cpu", init_scale=32.0).__getstate__())  # drops the blocks

    _, found = s.step(Fused(), return_found_inf=True)
    assert float(found) == 0.0 and float(got["grad_scale"]) == 4.0
    assert s.get_scale() == 32.0


# -- 4, 9, 10, 11. restore paths ------------------------------------------------------------------

def test_setstate_refuses_a_partial_state_and_changes_nothing():
    s = ampc.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    before = s.__getstate__()
    with pytest.raises(ampc.StateDictError, match="device"):  # before: stack garbage, strcmp on it
        s.__setstate__({"enabled": True})
    with pytest.raises(ampc.StateDictError, match="growth_factor"):
        s.__setstate__({k: v for k, v in before.items() if k != "growth_factor"})
    with pytest.raises(TypeError, match="expected a dict"):
        s.__setstate__([("enabled", True)])
    assert s.__getstate__() == before
    assert s.get_scale() == 8.0 and s.get_growth_interval() == 3


@pytest.mark.parametrize("key,value,error,match", [
    ("init_scale", -1.0, ValueError, "positive finite"),
    ("init_scale", 1e-50, ValueError, "positive finite float32"),  # 0 in float32
    ("init_scale", float("inf"), ValueError, "positive finite"),
    ("growth_factor", float("nan"), ValueError, "growth_factor"),
    ("backoff_factor", 0.0, ValueError, "backoff_factor"),
    ("growth_interval", -2, ValueError, "growth_interval"),
    ("growth_interval", 2.5, TypeError, "growth_interval must be an int"),
    ("init_growth_tracker", 2**31, ValueError, "_growth_tracker"),
    ("hysteresis", float("nan"), TypeError, "hysteresis must be an int"),
    ("hysteresis", 2**70, ValueError, "hysteresis is out of range"),
    ("hysteresis_left", 5, ValueError, "hysteresis_left"),
    ("steps", -1, ValueError, "steps"),
    ("skipped_steps", 7, ValueError, "skipped_steps"),
    ("enabled", 1, TypeError, "enabled must be a bool"),
    ("device", "tpu", ValueError, "device must be 'cuda' or 'cpu'"),
    ("bogus", 1, ValueError, "unexpected entry 'bogus'"),
    ("min_scale", 16.0, ValueError, "outside"),
])
def test_setstate_checks_every_value(key, value, error, match):
    s = ampc.GradScaler("cpu", init_scale=8.0)
    state = {**s.__getstate__(), key: value}
    before = s.__getstate__()
    with pytest.raises(error, match=match):
        s.__setstate__(state)
    assert s.__getstate__() == before


@pytest.mark.parametrize("value,error,match", [
    (2.5, TypeError, "hysteresis must be an int"),  # before: blamed _growth_tracker
    (float("nan"), TypeError, "hysteresis must be an int"),  # before: converted to int64 first (UB)
    (1e300, TypeError, "hysteresis must be an int"),
    (float("inf"), TypeError, "hysteresis must be an int"),
    (0, ValueError, "hysteresis must be at least 1"),
    (2**63, ValueError, "hysteresis is out of range"),
])
def test_load_state_dict_checks_before_converting(value, error, match):
    s = scaler(init_scale=8.0)
    before = s.state_dict()
    with pytest.raises(error, match=match):
        s.load_state_dict({**before, "hysteresis": value})
    assert s.state_dict() == before


def test_integer_entries_take_numpy_integers():
    s = scaler(init_scale=8.0)
    s.load_state_dict({"scale": np.float32(2.0), "growth_factor": 2.0, "backoff_factor": 0.5,
                       "growth_interval": np.int64(5), "_growth_tracker": np.int32(3)})
    assert (s.get_scale(), s.get_growth_interval(), s._get_growth_tracker()) == (2.0, 5, 3)


@pytest.mark.parametrize("setter,value", [("set_growth_factor", 1.0), ("set_backoff_factor", 1.0),
                                          ("set_growth_interval", 0)])
def test_own_state_dict_loads_after_any_accepted_setting(setter, value):
    """Before: the setters took these (as torch's do) but load_state_dict refused the result."""
    s = scaler(init_scale=8.0)
    getattr(s, setter)(value)
    sd = s.state_dict()
    t = ampc.GradScaler("cpu")
    t.load_state_dict(sd)
    assert t.state_dict() == sd
    u = pickle.loads(pickle.dumps(s))
    assert u.state_dict() == sd


def test_frozen_options_hold_the_scale():
    s = scaler(init_scale=8.0, growth_interval=1)
    s.set_growth_factor(1.0)  # never grows
    s.set_backoff_factor(1.0)  # never backs off
    for grad in ([1.0], [np.inf], [1.0]):
        s.scale(np.float32(1))
        s.step(grads_opt(grad))
        s.update()
    assert s.get_scale() == 8.0
    s.set_growth_factor(2.0)
    s.set_growth_interval(0)  # never grows either
    for _ in range(3):
        s.scale(np.float32(1))
        s.step(grads_opt([1.0]))
        s.update()
    assert s.get_scale() == 8.0 and s._get_growth_tracker() == 3


@pytest.mark.parametrize("setter,value,error", [
    ("set_growth_factor", 0.5, ValueError), ("set_growth_factor", float("nan"), ValueError),
    ("set_growth_factor", float("inf"), ValueError), ("set_backoff_factor", 0.0, ValueError),
    ("set_backoff_factor", -0.5, ValueError), ("set_backoff_factor", 1.5, ValueError),
    ("set_growth_interval", -1, ValueError), ("set_growth_interval", 2.0, TypeError),
    ("set_growth_factor", "2", TypeError),
])
def test_setters_refuse_what_would_break_the_scale(setter, value, error):
    s = scaler(init_scale=8.0)
    before = s.state_dict()
    with pytest.raises(error):
        getattr(s, setter)(value)
    assert s.state_dict() == before


def test_torch_checkpoint_with_frozen_options_loads():
    """A torch state dict after set_growth_factor(1.0) and set_growth_interval(0)."""
    s = ampc.GradScaler("cpu")
    s.load_state_dict({"scale": 1024.0, "growth_factor": 1.0, "backoff_factor": 1.0, "growth_interval": 0,
                       "_growth_tracker": 17})
    assert s.state_dict() == {"scale": 1024.0, "growth_factor": 1.0, "backoff_factor": 1.0, "growth_interval": 0,
                              "_growth_tracker": 17}


class OneRank(dist.ProcessGroup):
    """A process group of one rank, without MPI: its all-reduce leaves the array as it is."""

    def __init__(self):
        self.calls = 0

    def all_reduce(self, array, op):
        self.calls += 1


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_subclass_attributes_survive_a_round_trip(how):
    """Before: ShardedGradScaler lost _unscaled and _process_group, and step() raised AttributeError."""
    s = dist.ShardedGradScaler("cpu", init_scale=8.0, process_group=OneRank())
    s.note = [1, 2]
    t = {"pickle": lambda x: pickle.loads(pickle.dumps(x)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how](s)
    assert type(t) is dist.ShardedGradScaler
    assert isinstance(t._process_group, OneRank) and t._unscaled == {} and t.note == [1, 2] and t.get_scale() == 8.0
    opt = grads_opt([16.0])
    t.scale(np.float32(1))
    t.step(opt)
    t.update()
    np.testing.assert_array_equal(opt.param_groups[0]["params"][0].grad, [2.0])
    assert t._process_group.calls == 1


def test_setstate_refuses_attributes_where_there_are_none():
    s = ampc.GradScaler("cpu", init_scale=8.0)  # __slots__: no __dict__
    with pytest.raises(TypeError, match="has no attributes"):
        s.__setstate__({**s.__getstate__(), "__dict__": {"x": 1}})
    t = dist.ShardedGradScaler("cpu")
    with pytest.raises(TypeError, match="attribute names"):
        t.__setstate__({**t.__getstate__(), "__dict__": {1: 2}})
    assert s.get_scale() == 8.0 and not hasattr(t, "x")


# -- 6. nothing returned aliases the scaler ---------------------------------------------------------

def test_found_inf_kept_across_steps_keeps_its_value():
    """Before: a view of the scaler's flag, so [inf step, clean step] read [0.0, 0.0]; torch [1.0, 0.0]."""
    w = ampc.Parameter(np.ones(2, np.float32))
    opt = ampc.optim.SGD([w], lr=0.1)
    s = scaler(init_scale=4.0)
    kept = []
    for grad in ([np.inf, 1.0], [2.0, 2.0]):  # the scale backs off to 2 after the first
        w.grad = np.array(grad, np.float32)
        s.scale(np.float32(1))
        kept.append(s.step(opt, return_found_inf=True)[1])
        s.update()
    assert [float(np.asarray(f)) for f in kept] == [1.0, 0.0]
    np.testing.assert_array_equal(w.data, np.float32(1) - np.float32(0.1))


def test_found_inf_per_device_returns_copies():
    s = scaler()
    opt = grads_opt([np.inf])
    s.unscale_(opt)
    found = s._found_inf_per_device(opt)["cpu"]
    s.update()
    s.scale(np.float32(1))
    s.unscale_(grads_opt([1.0]))
    assert float(found) == 1.0
    found[...] = 0.0  # writing the copy changes nothing in the scaler
    s.update()
    assert s.stats()["last_step_skipped"] is False


def test_sharded_scaler_still_agrees_through_set_found_inf():
    s = dist.ShardedGradScaler("cpu", init_scale=8.0, process_group=OneRank())
    opt = grads_opt([np.inf])
    s.scale(np.float32(1))
    s.unscale_(opt)
    s._set_found_inf(opt, 0.0)  # as if every rank had been clean
    s.step(opt)
    s.update()
    assert s.stats()["last_step_skipped"] is False
    with pytest.raises(RuntimeError, match="no inf checks"):
        s._set_found_inf(grads_opt([1.0]), 1.0)


# -- torch's legacy names ---------------------------------------------------------------------------

def test_cpu_amp_grad_scaler_is_deprecated_and_works():
    with pytest.warns(FutureWarning, match=r"`ampc\.cpu\.amp\.GradScaler\(args\.\.\.\)` is deprecated"):
        s = ampc.cpu.amp.GradScaler(init_scale=8.0, growth_interval=1)
    assert isinstance(s, ampc.amp.GradScaler) and s.is_enabled()
    opt = grads_opt([16.0])
    s.scale(np.float32(1))
    s.step(opt)
    s.update()
    assert s.get_scale() == 16.0
    np.testing.assert_array_equal(opt.param_groups[0]["params"][0].grad, [2.0])


# -- sparse gradients (torch's COO layout, as ampc reads it: is_sparse, dtype, coalesce, _values) ---

class SparseCOO:
    """The part of a torch sparse COO tensor that GradScaler uses; test_torch_cpu.py has torch's."""

    is_sparse = True

    def __init__(self, indices, values):
        self.indices, self.values = list(indices), values
        self.dtype = "torch.float16" if values.dtype == np.float16 else "torch.float32"

    def coalesce(self):
        keys = sorted(set(self.indices))
        with np.errstate(over="ignore"):  # float16 sums overflow to inf, as torch's do
            summed = np.array([self.values[[i for i, k in enumerate(self.indices) if k == key]].sum(dtype=np.float32)
                               for key in keys], np.float32).astype(self.values.dtype)
        return SparseCOO(keys, summed)

    def _values(self):
        return self.values


def test_sparse_gradients_are_unscaled_through_their_values():
    """Before: "Cannot access data pointer..." (ampc asked the sparse tensor itself for its memory)."""
    s = scaler(init_scale=4.0)
    grad = SparseCOO([0, 2, 0], np.array([8.0, 4.0, 12.0], np.float32))
    param = SimpleNamespace(grad=grad)
    opt = SimpleNamespace(param_groups=[{"params": [param]}], step=lambda: None)
    s.unscale_(opt)
    np.testing.assert_array_equal(grad.values, [2.0, 1.0, 3.0])  # duplicates unscaled one by one
    assert param.grad is grad


def test_float16_sparse_gradients_are_coalesced_before_the_check():
    """torch coalesces a float16 sparse gradient where it is allowed (the inf check of a fused
    optimizer) and checks the sums: 40000 + 40000 overflows float16."""
    s = scaler(init_scale=4.0)
    grad = SparseCOO([1, 1], np.array([40000.0, 40000.0], np.float16))
    param = SimpleNamespace(grad=grad)
    opt = SimpleNamespace(param_groups=[{"params": [param]}], step=lambda: None)
    assert float(s._check_inf_per_device(opt)["cpu"]) == 1.0
    assert param.grad is not grad and param.grad.indices == [1] and np.isinf(param.grad.values[0])
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        s.unscale_(SimpleNamespace(param_groups=[{"params": [SimpleNamespace(grad=grad)]}]))


# --------------------------------------------------------------------------------------------
# Version counting: a gradient written in place that is itself an ampc.Parameter
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["unscale_", "unscale_ with max_norm", "fused step"])
def test_an_unscaled_gradient_that_is_a_parameter_counts_the_write(how):
    """The scaler (or a fused optimizer handed the scale) divides .grad in place: where that gradient
    is an ampc.Parameter (used as a weight elsewhere), its version goes up, and a cast of it cached
    in a region is not handed out again."""
    F = ampc.nn.functional
    x = np.eye(2, dtype=np.float32)
    grad = ampc.Parameter(np.full((2, 2), 8.0, np.float32))
    p = ampc.Parameter(np.zeros((2, 2), np.float32))
    p.grad = grad
    opt = ampc.optim.SGD([p], lr=1.0)
    scaler = ampc.GradScaler("cpu", init_scale=4.0)
    scaler.scale(np.float32(1.0))
    with ampc.autocast("cpu"):
        F.linear(x, grad)  # caches the gradient's bfloat16 copy
        if how == "fused step":
            scaler.step(opt)
        elif how == "unscale_":
            scaler.unscale_(opt)
        else:
            scaler.unscale_(opt, max_norm=100.0)
        assert grad._version == 1
        np.testing.assert_array_equal(np.asarray(F.linear(x, grad), np.float32), 2.0)
