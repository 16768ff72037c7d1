"""Leak mode: each public entry point run a few thousand times, and neither the references to its
inputs, nor the number of live objects, nor the memory Python and NumPy hold may grow (casts, the
GradScaler's methods, autocast's regions and dispatch, ops forward and backward, the tape, DLPack
import and export, error paths)."""

import gc
import sys
import tracemalloc

import numpy as np
import pytest

import ampc
from ampc.nn import _bare_ops

F = ampc.nn.functional
ROUNDS = 2000


def grows(fn, inputs, rounds=ROUNDS):
    """(references added to inputs, objects added, bytes added) over rounds calls of fn, after as
    many rounds of warm-up: caches and free lists fill before the count starts (under the system
    allocator, PYTHONMALLOC=malloc as in the sanitizer run, they settle over a thousand rounds or
    more; a leak keeps growing)."""
    for _ in range(rounds):
        fn()
    gc.collect()
    refs = [sys.getrefcount(x) for x in inputs]
    objects = len(gc.get_objects())
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(rounds):
        fn()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    refs_after = [sys.getrefcount(x) for x in inputs]  # counted as the first list was
    return [a - b for a, b in zip(refs_after, refs)], len(gc.get_objects()) - objects, after - before


def check(fn, *inputs):
    refs, objects, nbytes = grows(fn, inputs)
    assert refs == [0] * len(inputs) and objects <= 10 and nbytes < 64 * 1024, (refs, objects, nbytes)


def raises(fn, error):
    def run():
        try:
            fn()
        except error:
            pass
        else:
            raise AssertionError("no error")
    return run


rng = np.random.default_rng(0)
X = rng.standard_normal((16, 32)).astype(np.float32)
W = rng.standard_normal((8, 32)).astype(np.float32)
T = rng.integers(0, 8, 16)
ATTENTION = rng.standard_normal((1, 2, 70, 64)).astype(np.float32)  # (batch, heads, tokens, head_dim)


def test_casts():
    check(lambda: ampc.cast(X, "bfloat16"), X)
    out = np.empty_like(X, ampc.float16)
    check(lambda: ampc.cast(X, out=out), X, out)
    check(raises(lambda: ampc.cast(X, "int8"), (TypeError, ValueError)), X)
    check(lambda: ampc.cast(T, "float16"), T)  # an integer source
    check(lambda: ampc.cast(T[::-1], out=np.empty_like(T)), T)  # a same-dtype integer copy


def test_grad_scaler():
    p = ampc.Parameter(np.zeros(32, np.float32))
    opt = ampc.optim.SGD([p], lr=0.0)
    scaler = ampc.GradScaler("cpu")

    def step():
        p.grad = X[0].copy()
        scaler.scale(np.float32(1.0))
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        scaler.state_dict()
        scaler.stats()

    check(step, p, opt, scaler)

    def twice():  # the error path: unscale_ again before update()
        p.grad = X[0].copy()
        scaler.scale(np.float32(1.0))
        scaler.unscale_(opt)
        raises(lambda: scaler.unscale_(opt), RuntimeError)()
        scaler.step(opt)
        scaler.update()

    check(twice, p, opt, scaler)


def test_autocast_regions_and_dispatch():
    region = ampc.autocast("cpu")
    w = ampc.Parameter(W)

    def run():
        with region:
            F.linear(X, w)
            F.softmax(X, 1)

    check(run, region, w, X)


def test_ops_forward_and_backward():
    def run():
        y = F.linear(X, W)
        F.linear_backward(y, X, W)
        loss, lse, denom = _bare_ops.cross_entropy_forward(y, T)
        F.cross_entropy_backward(np.float32(1.0), y, T, lse=lse, denom=denom)
        F.layer_norm(X, (32,))
        F.add(X[:, :16], T, alpha=0.5)  # an integer operand, converted to the compute type first
        F.exp(T)

    check(run, X, W, T)
    check(raises(lambda: F.linear(X, W[:, :3]), ValueError), X, W)


def test_the_tape():
    w = ampc.nn.Parameter(W.copy())

    def run():
        w.grad = None
        loss = F.cross_entropy(F.gelu(F.linear(X, w)), T)
        loss.backward()

    check(run, w, X, T)


def test_dlpack_import_and_export():
    def run():
        a = ampc.from_dlpack(X)
        np.from_dlpack(a)

    check(run, X)
    check(raises(lambda: ampc.from_dlpack(object()), TypeError))


@pytest.mark.parametrize("rounds", [ROUNDS])
def test_the_check_catches_a_leak(rounds):
    """The harness itself: a function that keeps what it makes is caught."""
    kept = []
    refs, objects, nbytes = grows(lambda: kept.append(np.zeros(8)), [], rounds)
    assert nbytes > 64 * 1024
    x = np.zeros(3)
    assert grows(lambda: kept.append(x), [x], rounds)[0] == [rounds]


@pytest.mark.gpu
def test_gpu_pool_does_not_grow():
    """On the GPU: the bytes ampc's pool hands out come back (ops forward and backward, a cast, the
    tape, a GradScaler step), as ampc.cuda.memory_allocated counts them."""
    x = ampc._C._to_device(X, 0)
    w = ampc.nn.Parameter(ampc._C._to_device(W, 0))
    t = ampc._C._to_device(T, 0)
    columns = ampc._C._to_device(np.arange(32), 0)
    opt = ampc.optim.SGD([w], lr=0.0)
    scaler = ampc.GradScaler("cuda")

    def run():
        w.grad = None
        with ampc.autocast("cuda"):
            loss = F.cross_entropy(F.linear(x, w), t)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        ampc.cast(x, "bfloat16")
        ampc.cast(t, "float32")  # an integer source
        F.add(x, columns)  # an integer operand
        q = ampc.cast(ampc._C._to_device(ATTENTION, 0), "float16")  # the fused attention kernels and their scratch
        served = ampc._C._attention(q, q, q, True, 0.125)
        if served is not None:
            ampc._C._attention_backward(served[0], q, q, q, *served, True, 0.125)

    for _ in range(20):
        run()
    ampc.cuda.synchronize()
    before = ampc.cuda.memory_allocated()
    for _ in range(500):
        run()
    ampc.cuda.synchronize()
    assert ampc.cuda.memory_allocated() == before
