"""ampc.autograd.Function: forward and backward written by hand, as torch users write them, with
custom_fwd/custom_bwd's autocast handling."""

import numpy as np
import pytest

import ampc
from ampc.autograd import Function, Tensor

F = ampc.nn.functional


class Affine(Function):
    """x @ w.T + b, its gradients by hand (b may be None: no gradient for it)."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        out = np.asarray(x) @ np.asarray(w).T
        return out + np.asarray(b) if b is not None else out

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        x, w = np.asarray(x), np.asarray(w)
        return grad @ w, grad.T @ x, grad.sum(axis=0) if ctx.has_bias else None


def test_gradients_reach_parameters_and_earlier_ops(rng):
    x = rng.standard_normal((5, 3))
    w = ampc.nn.Parameter(rng.standard_normal((4, 3)))
    b = ampc.nn.Parameter(rng.standard_normal(4))
    v = ampc.nn.Parameter(rng.standard_normal((3, 3)))
    h = F.linear(x, v)  # an op of ampc's before the custom one: its gradient must flow through
    y = Affine.apply(h, w, b)
    assert isinstance(y, Tensor) and y.grad_fn.name == "AffineBackward"
    (y * y).sum().backward()
    hx = x @ np.asarray(v).T
    g = 2 * (hx @ np.asarray(w).T + np.asarray(b))  # d(sum y^2)/dy in float64
    np.testing.assert_allclose(w.grad, g.T @ hx, rtol=1e-12)
    np.testing.assert_allclose(b.grad, g.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(v.grad, (g @ np.asarray(w)).T @ x, rtol=1e-12)


def test_forward_runs_off_the_tape_and_sees_needs_input_grad(rng):
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b):
            seen["grad"] = ampc.is_grad_enabled()
            seen["needs"] = ctx.needs_input_grad
            seen["inner"] = F.relu(a)  # an op inside forward records nothing
            return a * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, None

    p = ampc.nn.Parameter(rng.standard_normal(3))
    out = Probe.apply(p, rng.standard_normal(3))
    assert seen["grad"] is False and seen["needs"] == (True, False)
    assert not isinstance(seen["inner"], Tensor)
    out.sum().backward()
    np.testing.assert_array_equal(p.grad, np.full(3, 2.0))
    with ampc.no_grad():
        assert not isinstance(Probe.apply(p, np.ones(3)), Tensor)
    assert isinstance(Probe.apply(np.ones(3), np.ones(3)), np.ndarray)  # nothing needs a gradient


def test_an_unused_output_gets_zeros_and_a_wrong_count_is_torchs_error(rng):
    got = []

    class Split(Function):
        @staticmethod
        def forward(ctx, a):
            return a + 1, a - 1

        @staticmethod
        def backward(ctx, g1, g2):
            got.extend([g1.copy(), g2.copy()])
            return g1 + g2

    p = ampc.nn.Parameter(rng.standard_normal(4))
    first, _ = Split.apply(p)
    (3 * first).sum().backward()
    np.testing.assert_array_equal(got[0], np.full(4, 3.0))
    np.testing.assert_array_equal(got[1], np.zeros(4))
    np.testing.assert_array_equal(p.grad, np.full(4, 3.0))

    class TooMany(Function):
        @staticmethod
        def forward(ctx, a):
            return a * 1

        @staticmethod
        def backward(ctx, grad):
            return grad, grad

    with pytest.raises(RuntimeError, match=r"^function TooManyBackward returned an incorrect number of gradients "
                                           r"\(expected 1, got 2\)$"):
        TooMany.apply(ampc.nn.Parameter(np.ones(2))).sum().backward()
    with pytest.raises(TypeError, match="takes no keyword arguments"):
        TooMany.apply(a=np.ones(2))


def test_custom_fwd_casts_and_custom_bwd_restores_the_region(rng):
    """Under a bfloat16 region: cast_inputs=float32 gives forward float32 arrays with autocast off,
    and backward runs with the forward's autocast state (off, as torch's custom_bwd restores it)."""
    state = {}

    class Square(Function):
        @staticmethod
        @ampc.amp.custom_fwd(device_type="cpu", cast_inputs=ampc.float32)
        def forward(ctx, x):
            state["fwd"] = (np.asarray(x).dtype, ampc.is_autocast_enabled("cpu"))
            ctx.save_for_backward(x)
            return np.asarray(x) * np.asarray(x)

        @staticmethod
        @ampc.amp.custom_bwd(device_type="cpu")
        def backward(ctx, grad):
            state["bwd"] = ampc.is_autocast_enabled("cpu")
            (x,) = ctx.saved_tensors
            return 2 * np.asarray(x) * grad

    x = rng.standard_normal(6).astype(np.float32)
    p = ampc.nn.Parameter(x.astype(ml_bf16()))
    with ampc.autocast("cpu", dtype=ampc.bfloat16):
        y = Square.apply(p)
    y.sum().backward()
    assert state == {"fwd": (np.float32, False), "bwd": False}
    xf = x.astype(ml_bf16()).astype(np.float64)
    np.testing.assert_array_equal(p.grad.astype(np.float64), (2 * xf).astype(ml_bf16()).astype(np.float64))


def ml_bf16():
    return np.dtype(ampc.bfloat16)
