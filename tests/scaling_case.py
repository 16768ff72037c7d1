"""PyTorch's _create_scaling_case on NumPy: two identical Sequential(Linear(8, 8),
Linear(8, 8)) models with an MSE loss and a written-out backward, an SGD with
lr 1.0 (so any error shows), 4 batches, and the skip iteration 2.

The scale is a power of two, so scaling the loss scales every gradient exactly
and unscaling undoes it exactly: the scaled run must equal the control bit for
bit, which is stricter than torch's atol of 1e-7."""

import copy

import numpy as np


class Param:
    def __init__(self, data):
        self.data = data
        self.grad = None


class SGD:
    """Plain SGD, momentum optional: param -= lr * (buf = momentum * buf + grad)."""

    def __init__(self, params, lr=1.0, momentum=0.0):
        self.param_groups = [{"params": list(params), "lr": lr, "momentum": momentum}]
        self.state = {}
        self.steps = 0

    def zero_grad(self):
        for g in self.param_groups:
            for p in g["params"]:
                p.grad = None

    def step(self):
        self.steps += 1
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if g["momentum"]:
                    buf = self.state.get(id(p))
                    buf = d.copy() if buf is None else g["momentum"] * buf + d
                    self.state[id(p)] = buf
                    d = buf
                p.data -= np.float32(g["lr"]) * d


class Model:
    def __init__(self, rng, n=8):
        self.layers = [
            (Param(rng.standard_normal((n, n)).astype(np.float32) / 3), Param(rng.standard_normal(n).astype(np.float32) / 3))
            for _ in range(2)
        ]

    def params(self):
        return [p for layer in self.layers for p in layer]

    def named_params(self):
        return [(f"{i}.{kind}", p) for i, layer in enumerate(self.layers) for kind, p in zip(("weight", "bias"), layer)]

    def loss_and_backward(self, x, target, seed=np.float32(1.0), accumulate=False):
        """MSE loss; gradients of seed * loss into .grad (added to them when accumulating)."""
        (w1, b1), (w2, b2) = self.layers
        h = x @ w1.data.T + b1.data
        y = h @ w2.data.T + b2.data
        loss = np.mean((y - target) ** 2, dtype=np.float32)
        dy = (np.float32(2.0 / y.size) * seed) * (y - target)
        grads = {w2: dy.T @ h, b2: dy.sum(0)}
        dh = dy @ w2.data
        grads[w1] = dh.T @ x
        grads[b1] = dh.sum(0)
        for p, g in grads.items():
            g = g.astype(np.float32)
            p.grad = g if (not accumulate or p.grad is None) else p.grad + g
        return loss


def scaling_case(seed=0, momentum=0.0):
    rng = np.random.default_rng(seed)
    control = Model(rng)
    scaled = copy.deepcopy(control)
    data = [(rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 8)).astype(np.float32))
            for _ in range(4)]
    return control, SGD(control.params(), momentum=momentum), scaled, SGD(scaled.params(), momentum=momentum), data


def params_of(model):
    return [p.data.copy() for p in model.params()]
