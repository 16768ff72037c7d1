"""GradScaler and ampc.optim on the CPU, against NumPy doing the same work in the same run.

    python benchmarks/scaler_cpu.py [--sets NAME ...] [--rounds N]

For the parameter sets of spec/anchors.md (by default ResNet-50 and GPT-2 124M; the 1.2B set
needs about 25 GB for AdamW), float32 NumPy gradients of random normal values:

1. unscale + inf/NaN check: ampc's scaler.unscale_(optimizer) + update() against NumPy's
   ``g *= inv; np.isfinite(g).all()`` over the same gradients (8 bytes an element at least).
2. optimizer step: ampc.optim.SGD(momentum=0.9) and AdamW, one fused pass over every
   parameter, against the same update written as NumPy in-place operations (torch's
   for-loop algorithm, one temporary per parameter at most).

ampc on all its threads and on one (NumPy's single thread); best of --rounds interleaved
rounds, since a VM's timings move between runs. The floor is the bytes moved at the
measured copy bandwidth (ampc's threaded bit copy); passes that update in place skip the
copy's write-allocate reads, so they can pass 100 % of it.
"""

import argparse
import os
import sys
import time

import numpy as np

import ampc
from ampc import optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from param_sets import SETS  # noqa: E402


def best(fn, rounds):
    fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def copy_bandwidth(rounds):
    x = np.random.default_rng(0).standard_normal(2**26).astype(np.float32)
    y = np.empty_like(x)
    ampc_ms = best(lambda: ampc.cast(x, out=y), rounds)
    numpy_ms = best(lambda: np.copyto(y, x), rounds)
    return 8 * x.size / ampc_ms / 1e6, 8 * x.size / numpy_ms / 1e6  # GB/s


class Holder:
    """Just enough of an optimizer for GradScaler.unscale_: param_groups of .grad holders."""

    def __init__(self, params):
        self.param_groups = [{"params": params}]


def numpy_unscale(grads, inv):
    found = False
    for g in grads:
        g *= inv
        found |= not np.isfinite(g).all()
    return found


def numpy_sgd(params, bufs, lr=1e-6, momentum=0.9):
    for p, b in zip(params, bufs):
        b *= momentum
        b += p.grad
        p.data -= lr * b


def numpy_adamw(params, states, lr=1e-6, beta1=0.9, beta2=0.999, eps=1e-8, wd=1e-2):
    for p, s in zip(params, states):
        s["step"] += 1
        g, m, v = p.grad, s["m"], s["v"]
        p.data *= 1 - lr * wd
        m *= beta1
        m += (1 - beta1) * g
        v *= beta2
        v += (1 - beta2) * g * g
        bc1, bc2 = 1 - beta1 ** s["step"], 1 - beta2 ** s["step"]
        denom = np.sqrt(v) / np.sqrt(bc2)
        denom += eps
        p.data -= (lr / bc1) * m / denom


def run_set(name, shapes, rounds, threads):
    rng = np.random.default_rng(1)
    params = [optim.Parameter((rng.standard_normal(s) * 0.01).astype(np.float32)) for s in shapes]
    for p in params:
        p.grad = rng.standard_normal(p.shape).astype(np.float32)
    grads = [p.grad for p in params]
    n = sum(g.size for g in grads)
    holder = Holder(params)
    scaler = ampc.GradScaler("cpu", init_scale=1.0)  # inv = 1: the gradients keep their values
    scaler.scale(np.float32(1.0))

    def ampc_unscale():
        scaler.unscale_(holder)
        scaler.update()

    sgd = optim.SGD(params, lr=1e-6, momentum=0.9)
    adamw = optim.AdamW(params, lr=1e-6)
    bufs = [np.zeros_like(p.data) for p in params]
    states = [{"step": 0, "m": np.zeros_like(p.data), "v": np.zeros_like(p.data)} for p in params]
    measured = {"unscale": {}, "SGD": {}, "AdamW": {}}
    for label, count in (("ampc", threads), ("ampc 1 thread", 1)):
        ampc.set_num_threads(count)
        measured["unscale"][label] = best(ampc_unscale, rounds)
        measured["SGD"][label] = best(sgd.step, rounds)
        measured["AdamW"][label] = best(adamw.step, rounds)
    ampc.set_num_threads(threads)
    measured["unscale"]["NumPy"] = best(lambda: numpy_unscale(grads, np.float32(1.0)), rounds)
    measured["SGD"]["NumPy"] = best(lambda: numpy_sgd(params, bufs), rounds)
    measured["AdamW"]["NumPy"] = best(lambda: numpy_adamw(params, states), rounds)
    # Bytes an element: unscale reads and writes g; SGD reads p, g, buf and writes p, buf;
    # AdamW reads p, g, m, v and writes p, m, v.
    return n, len(shapes), measured, {"unscale": 8, "SGD": 20, "AdamW": 28}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sets", nargs="*", default=["ResNet-50", "GPT-2 124M"])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    threads = ampc.get_num_threads()
    bw_all, bw_one = copy_bandwidth(args.rounds)
    print(f"CPU: {os.cpu_count()} cores, ampc on {threads} threads; copy bandwidth {bw_all:.1f} GB/s "
          f"(ampc, all threads), {bw_one:.1f} GB/s (NumPy, one thread); times in ms, best of {args.rounds}")
    print(f"\n{'set':<12}{'work':>9}{'elements':>10}{'NumPy':>9}{'ampc 1 thr':>11}{'x NumPy':>8}"
          f"{'ampc':>9}{'x NumPy':>8}{'of floor':>9}")
    for name in args.sets:
        n, k, measured, bytes_per = run_set(name, SETS[name](), args.rounds, threads)
        for work, t in measured.items():
            floor = bytes_per[work] * n / bw_all / 1e6
            print(f"{name[:12]:<12}{work:>9}{n / 1e6:>9.1f}M{t['NumPy']:>9.2f}{t['ampc 1 thread']:>11.2f}"
                  f"{t['NumPy'] / t['ampc 1 thread']:>7.2f}x{t['ampc']:>9.2f}{t['NumPy'] / t['ampc']:>7.2f}x"
                  f"{100 * floor / t['ampc']:>8.0f}%")


if __name__ == "__main__":
    main()
