"""Where the host time goes in ampc's GradScaler and ampc.optim calls on torch CUDA tensors:
host time per call (nothing waited for) against GPU time, and the cost of reading the arrays
alone (ampc.optim's dry run: every array read and checked, no kernel).

    python benchmarks/scaler_diag.py
"""

import os
import sys
import time

import torch

import ampc
from ampc import _C, optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from param_sets import SETS  # noqa: E402
from scaler import copy_bandwidth  # noqa: E402


def host_and_gpu(fn, repeat=40):
    host, gpu = [], []
    for _ in range(repeat):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        host.append((t1 - t0) * 1e3)
        gpu.append(a.elapsed_time(b))
    host.sort()
    gpu.sort()
    return host[repeat // 2], gpu[repeat // 2]


def per_call(fn, repeat=200):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeat * 1e3


for name in ("ResNet-50", "GPT-2 124M"):
    shapes = SETS[name]()
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in shapes]
    for q in params:
        q.grad = torch.randn_like(q)
    opt = torch.optim.SGD(params, lr=0.0)
    s = ampc.GradScaler("cuda")
    s.scale(torch.ones((), device="cuda"))

    def unscale():
        s.unscale_(opt)
        s.update()

    h, g = host_and_gpu(unscale)
    print(f"{name} ({len(params)} tensors): unscale_+update host {h:.3f} ms, GPU {g:.3f} ms; "
          f"check+update {per_call(lambda: (s._check_inf_per_device(opt), s.update())):.3f} ms a call")
    ours = [optim.Parameter(p.data) for p in params]
    for p, q in zip(params, ours):
        q.grad = p.grad
    sgd = optim.SGD(ours, lr=0.0, momentum=0.9)
    sgd.step()
    data, grads = [q.data for q in ours], [q.grad for q in ours]
    bufs = [sgd.state[q]["momentum_buffer"] for q in ours]
    firsts = [None] * len(ours)
    kw = dict(lr=0.0, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False)
    read_only = per_call(lambda: _C._sgd_step(data, grads, bufs, firsts, dry_run=True, **kw))
    h, g = host_and_gpu(sgd.step)
    n = 3 * len(ours)
    print(f"  ampc.optim.SGD step: host {h:.3f} ms, GPU {g:.3f} ms; reading the {n} arrays {read_only:.3f} ms "
          f"({1e3 * read_only / n:.2f} us an array)")
    tsgd = torch.optim.SGD(params, lr=0.0, momentum=0.9, foreach=True)
    tsgd.step()
    h, g = host_and_gpu(tsgd.step)
    print(f"  torch SGD(foreach) step: host {h:.3f} ms, GPU {g:.3f} ms")
    del params, ours, opt, sgd, tsgd
    torch.cuda.empty_cache()

# The optimizer kernels alone (no scaler): Adam(W) moves 28 bytes an element (param, exp_avg,
# exp_avg_sq read and written, the gradient read), SGD with momentum 20.
bw = copy_bandwidth(repeat=20)
for name in ("GPT-2 124M", "LLaMA-style 1.2B"):
    shapes = SETS[name]()
    params = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
    for q in params:
        q.grad = torch.randn_like(q)
    n = sum(q.numel() for q in params)
    ours = [optim.Parameter(p.data) for p in params]
    for p, q in zip(params, ours):
        q.grad = p.grad
    for label, bytes_per, mine, theirs in (
            ("SGD momentum", 20, optim.SGD(ours, lr=0.0, momentum=0.9),
             torch.optim.SGD(params, lr=0.0, momentum=0.9, fused=True)),
            ("AdamW", 28, optim.AdamW(ours, lr=0.0), torch.optim.AdamW(params, lr=0.0, fused=True))):
        mine.step()
        theirs.step()
        g_ours, g_theirs = host_and_gpu(mine.step)[1], host_and_gpu(theirs.step)[1]
        floor = bytes_per * n / bw / 1e6
        print(f"{name}: {label} kernel alone: ampc {g_ours:.3f} ms ({100 * floor / g_ours:.0f}% of the copy "
              f"bandwidth), torch fused {g_theirs:.3f} ms ({100 * floor / g_theirs:.0f}%)")
        del mine, theirs
    del params, ours
    torch.cuda.empty_cache()
