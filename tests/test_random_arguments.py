"""Every public callable given random arguments (issue 8's bad-input matrix, swept): ampc's functions,
ampc.nn.functional's ops, ampc.distributed's (without a process group), every layer (made, called,
its state dict loaded), every optimizer (made, stepped, a state dict loaded), GradScaler's methods
and Tensor's. Each call either works or raises one of the exceptions a user is told to expect
(TypeError, ValueError, RuntimeError, IndexError for a dimension, OverflowError,
NotImplementedError, torch's AssertionError where torch raises it); never an AttributeError,
ZeroDivisionError or MemoryError from inside ampc. A longer sweep: AMPC_RANDOM_CALLS=300 python -m
pytest tests/test_random_arguments.py.

What this found, and what is fixed: sdpa with a head size of 0 (a division by zero), stack_backward
with a huge count (memory exhausted), layers made with groups=0, a number as a loss's class weights,
a Linear of no inputs, a list given to a layer with weights, Parameter of a non-array, optimizer
state dicts without their entries, GradScaler's methods given no optimizer, ampc.distributed's calls
given something that is no process group."""

import inspect
import os
import random
import warnings

import ml_dtypes
import numpy as np
import pytest

import ampc
from ampc import nn

CALLS = int(os.environ.get("AMPC_RANDOM_CALLS", "25"))  # per callable
EXPECTED = (TypeError, ValueError, RuntimeError, IndexError, OverflowError, NotImplementedError, BufferError,
            ampc.ArgumentError)


def values():
    """Fresh each time (a callee may write into an array it was given)."""
    return [None, "x", "cpu", "mean", 1, -1, 0, 3, 2.5, float("nan"), float("inf"), True, (2,), [1, 2], (),
            np.float32(1.5), 10**30, np.zeros((0,), np.float32), np.ones((2, 3), np.float32),
            np.ones((2, 3, 4, 5), np.float32), np.ones((2, 3), np.int64), np.ones((2, 3), bool),
            np.ones((2, 3), np.float16), np.ones((3,), np.float64), np.array(1.0, np.float32),
            np.ones((2, 3), np.complex64), np.ones((1, 1, 1, 1), ml_dtypes.bfloat16),
            np.full((2, 3), np.nan, np.float32), np.ones((4, 3), np.float32)[::-2], np.float16, object(), {}]


def positional_range(f):
    try:
        params = [p for p in inspect.signature(f).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # a builtin without a text signature
        return 0, 4
    return len([p for p in params if p.default is p.empty]), len(params)


def random_arguments(draw, f):
    low, high = positional_range(f)
    pool = values()
    return [draw.choice(pool) for _ in range(draw.randint(low, high))]


def call_expecting(f, args, also=()):
    """f(*args): a result or an EXPECTED exception (with a message); anything else fails, naming the
    call."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return f(*args)
        except EXPECTED + tuple(also) as error:
            assert str(error), f"{f.__qualname__}{tuple(args)!r:.300}: {type(error).__name__} without a message"
        except Exception as error:  # noqa: BLE001 - the point: which one, from which call
            pytest.fail(f"{f.__qualname__}{tuple(args)!r:.300} raised {type(error).__name__}: {error}")
    return None


def public_functions(module, skip=()):
    return [(name, getattr(module, name)) for name in sorted(dir(module))
            if not name.startswith("_") and name not in skip and callable(getattr(module, name))
            and not inspect.isclass(getattr(module, name)) and not inspect.ismodule(getattr(module, name))
            and getattr(getattr(module, name), "__module__", "").startswith("ampc")]


# state that outlives a call (threads, seeds, autocast's global switches): not swept
GLOBAL_SETTERS = {"manual_seed", "set_num_threads", "set_autocast_enabled", "set_autocast_cpu_enabled",
                  "set_autocast_dtype", "set_autocast_cpu_dtype", "set_autocast_gpu_dtype",
                  "set_autocast_cache_enabled", "autocast_increment_nesting", "autocast_decrement_nesting",
                  "register_autocast", "set_grad_enabled"}


@pytest.mark.parametrize("name,f", public_functions(nn.functional), ids=lambda v: v if isinstance(v, str) else "")
def test_functional_ops(name, f, test_seed):
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        call_expecting(f, random_arguments(draw, f))


DISTRIBUTED = public_functions(ampc.distributed, {"init_process_group", "destroy_process_group"})


@pytest.mark.parametrize("name,f", public_functions(ampc, GLOBAL_SETTERS) + DISTRIBUTED,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_top_level_functions(name, f, test_seed):
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        result = call_expecting(f, random_arguments(draw, f))
        if name == "autocast" and result is not None:
            call_expecting(lambda: result.__enter__() and result.__exit__(None, None, None), [])
    assert not ampc.is_autocast_enabled("cpu")  # nothing left switched on


LAYERS = [getattr(nn, name) for name in nn.modules.__all__ if name not in ("Module", "Parameter")]


@pytest.mark.parametrize("layer", LAYERS, ids=lambda c: c.__name__)
def test_layers(layer, test_seed):
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        module = call_expecting(layer, random_arguments(draw, layer))
        if module is None:
            continue
        pool = values()
        call_expecting(module, [draw.choice(pool) for _ in range(draw.randint(1, 2))])
        state = {key: draw.choice(pool) for key in module.state_dict()}
        call_expecting(lambda sd, strict: module.load_state_dict(sd, strict=strict), [state, draw.random() < 0.5])
        call_expecting(repr, [module])


OPTIMIZERS = [ampc.optim.SGD, ampc.optim.Adam, ampc.optim.AdamW]


@pytest.mark.parametrize("optimizer", OPTIMIZERS, ids=lambda c: c.__name__)
def test_optimizers(optimizer, test_seed):
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        args = random_arguments(draw, optimizer)
        if args:
            args[0] = draw.choice([[nn.Parameter(np.ones(3, np.float32))], [], [np.ones(3, np.float32)], args[0]])
        opt = call_expecting(optimizer, args)
        if opt is None:
            continue
        for p in (p for g in opt.param_groups for p in g["params"]):
            p.grad = draw.choice([None, np.ones(3, np.float32), np.full(3, np.nan, np.float32)])
        call_expecting(opt.step, [])
        payload = draw.choice([opt.state_dict(), {}, {"state": 1}, {"param_groups": [{}]},
                               {"state": {}, "param_groups": "x"}, {"state": {0: {"step": "x"}},
                                                                   "param_groups": opt.state_dict()["param_groups"]}])
        call_expecting(opt.load_state_dict, [payload])


SCALER_METHODS = ["scale", "unscale_", "step", "update", "get_scale", "load_state_dict", "set_growth_factor",
                  "set_backoff_factor", "set_growth_interval", "overflow_report", "stats", "state_dict"]


def test_grad_scaler_methods(test_seed):
    """torch's AssertionErrors (a step before scale) are expected here too (a state dict without a
    required entry raises ampc.StateDictError, torch's KeyError and a ValueError)."""
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        scaler = ampc.GradScaler("cpu")
        for name in draw.sample(SCALER_METHODS, len(SCALER_METHODS)):
            method = getattr(scaler, name)
            call_expecting(method, random_arguments(draw, method), also=(AssertionError,))


TENSOR_METHODS = ["reshape", "transpose", "permute", "flatten", "sum", "mean", "softmax", "log_softmax", "unsqueeze",
                  "squeeze", "split", "chunk", "to", "size", "__getitem__", "__add__", "__radd__", "__sub__",
                  "__rsub__", "__mul__", "__truediv__", "__rtruediv__", "__matmul__", "__rmatmul__", "__pow__",
                  "__rpow__", "argmax", "argmin", "backward"]


def test_tensor_methods(test_seed):
    draw = random.Random(test_seed)
    for _ in range(CALLS):
        weight = nn.Parameter(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
        tensor = weight * 2.0  # a Tensor with a graph
        for name in draw.sample(TENSOR_METHODS, len(TENSOR_METHODS)):
            method = getattr(tensor, name, None)
            if method is not None:
                call_expecting(method, random_arguments(draw, method))
