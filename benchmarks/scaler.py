"""GradScaler and ampc.optim on the GPU, against torch in the same run.

    python benchmarks/scaler.py [--repeat N] [--sets NAME ...]

For the three parameter sets of spec/anchors.md (ResNet-50, GPT-2 124M, a LLaMA-style 1.2B
model), fp32 parameters and gradients of random normal values:

1. unscale + inf/NaN check: ampc's scaler.unscale_(optimizer) against torch's own kernel
   (torch._amp_foreach_non_finite_check_and_unscale_) and torch's scaler.unscale_; the floor
   is 8 bytes an element (read + write).
2. fused unscale + clip: ampc's scaler.unscale_(optimizer, max_norm=1.0) against torch's
   recipe, scaler.unscale_ then clip_grad_norm_(foreach=True); the floor is 12 bytes an
   element (read for the norm, then read + write). And unscale_(..., defer=True), which
   reads the gradients once (4 bytes) and leaves the division to a fused optimizer's step.
3. a whole iteration without the backward: scale(loss), step (which unscales), update. ampc's
   GradScaler with ampc.optim.SGD(momentum=0.9) / AdamW (fused kernels that unscale and skip
   themselves) against torch's GradScaler with torch.optim.SGD(momentum=0.9, foreach=True) /
   AdamW(fused=True). The floor is what a fused iteration must move: the inf check reads the
   gradients (4 bytes), then SGD reads param, gradient, buffer and writes all three (24), AdamW
   reads and writes param, gradient and two moments (32).
4. the same iteration with clipping to norm 1.0, AdamW: torch's recipe (unscale_,
   clip_grad_norm_(foreach=True), fused AdamW) against ampc's unscale_(max_norm=1.0) and
   unscale_(max_norm=1.0, defer=True). Floors: eager 12 + 28 bytes (the step after unscale_
   does not write the gradient), deferred 4 + 32.

GPU time from CUDA events (median of --repeat after warm-up) and wall time per call, which
includes the host's work and, for torch's plain optimizers, its host synchronisation.
"""

import argparse
import os
import statistics
import sys
import time

import torch

import ampc
from ampc import optim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from param_sets import SETS  # noqa: E402


def timed(fn, repeat):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    t0 = time.perf_counter()
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / repeat
    return statistics.median(s.elapsed_time(e) for s, e in events), wall * 1e3


def copy_bandwidth(repeat):
    x = torch.empty(2**28, device="cuda")
    y = torch.empty_like(x)
    ms, _ = timed(lambda: y.copy_(x), repeat)
    return 8 * x.numel() / ms / 1e6  # GB/s


def fresh_params(shapes):
    params = [torch.nn.Parameter(torch.randn(s, device="cuda") * 0.01) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    return params


def torch_scaler():
    s = torch.amp.GradScaler("cuda")
    s.scale(torch.ones((), device="cuda"))
    return s


def ampc_scaler():
    s = ampc.GradScaler("cuda")
    s.scale(torch.ones((), device="cuda"))
    return s


def unscale_rows(shapes, repeat, bw):
    params = fresh_params(shapes)
    grads = [p.grad for p in params]
    n = sum(g.numel() for g in grads)
    opt = torch.optim.SGD(params, lr=0.0)
    found = torch.zeros((), device="cuda")
    inv = torch.full((), 1.0 / 65536, device="cuda")
    kernel = timed(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv), repeat)
    ts, ours = torch_scaler(), ampc_scaler()

    def torch_unscale():
        ts.unscale_(opt)
        ts.update()

    def ampc_unscale():
        ours.unscale_(opt)
        ours.update()

    def torch_clip():
        ts.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        ts.update()

    def ampc_clip():
        ours.unscale_(opt, max_norm=1.0)
        ours.update()

    fused = torch.optim.AdamW(params, fused=True)  # takes grad_scale: defer=True defers to it

    def ampc_deferred():
        ours.unscale_(fused, max_norm=1.0, defer=True)
        ours.update()

    result = dict(tensors=len(grads), n=n, floor8=8 * n / bw / 1e6, floor12=12 * n / bw / 1e6,
                  floor4=4 * n / bw / 1e6, kernel=kernel,
                  torch_unscale=timed(torch_unscale, repeat), ampc_unscale=timed(ampc_unscale, repeat),
                  torch_clip=timed(torch_clip, repeat), ampc_clip=timed(ampc_clip, repeat),
                  ampc_deferred=timed(ampc_deferred, repeat))
    del params, grads, opt, fused
    torch.cuda.empty_cache()
    return result


def twins(shapes):
    """torch parameters with gradients, and ampc.optim parameters holding copies of both."""
    theirs = fresh_params(shapes)
    ours = [optim.Parameter(p.data.clone()) for p in theirs]
    for p, q in zip(theirs, ours):
        q.grad = p.grad.clone()
    return theirs, ours


def optimizer_pair(name, theirs, ours):
    """torch's SGD(momentum, foreach) or fused AdamW, and ampc's fused counterpart."""
    if name == "SGD":
        return (torch.optim.SGD(theirs, lr=1e-6, momentum=0.9, foreach=True),
                optim.SGD(ours, lr=1e-6, momentum=0.9))
    return torch.optim.AdamW(theirs, lr=1e-6, fused=True), optim.AdamW(ours, lr=1e-6)


def iteration_rows(shapes, repeat, bw):
    n = sum(torch.Size(s).numel() for s in shapes)
    rows = {}
    for name, bytes_per in (("SGD", 28), ("AdamW", 36)):
        theirs, ours = twins(shapes)
        opt_t, opt_o = optimizer_pair(name, theirs, ours)
        loss = torch.ones((), device="cuda")
        ts, so = torch_scaler(), ampc_scaler()

        def torch_iter():
            ts.scale(loss)
            ts.step(opt_t)
            ts.update()

        def ampc_iter():
            so.scale(loss)
            so.step(opt_o)
            so.update()

        rows[name] = dict(floor=bytes_per * n / bw / 1e6, torch=timed(torch_iter, repeat), ampc=timed(ampc_iter, repeat))
        del theirs, ours, opt_t, opt_o
        torch.cuda.empty_cache()
    return rows


def clipped_iteration_row(shapes, repeat, bw):
    n = sum(torch.Size(s).numel() for s in shapes)
    theirs, ours = twins(shapes)
    opt_t, opt_o = optimizer_pair("AdamW", theirs, ours)
    loss = torch.ones((), device="cuda")
    ts, so = torch_scaler(), ampc_scaler()

    def torch_iter():
        ts.scale(loss)
        ts.unscale_(opt_t)
        torch.nn.utils.clip_grad_norm_(theirs, 1.0, foreach=True)
        ts.step(opt_t)
        ts.update()

    def ampc_iter(defer):
        so.scale(loss)
        so.unscale_(opt_o, max_norm=1.0, defer=defer)
        so.step(opt_o)
        so.update()

    row = dict(floor_eager=40 * n / bw / 1e6, floor_deferred=36 * n / bw / 1e6, torch=timed(torch_iter, repeat),
               eager=timed(lambda: ampc_iter(False), repeat), deferred=timed(lambda: ampc_iter(True), repeat))
    del theirs, ours, opt_t, opt_o
    torch.cuda.empty_cache()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--sets", nargs="*", default=list(SETS))
    args = p.parse_args()
    bw = copy_bandwidth(args.repeat)
    print(f"GPU {torch.cuda.get_device_name()}, device-to-device copy {bw:.0f} GB/s; times in ms (GPU, median)")
    unscale = {name: unscale_rows(SETS[name](), args.repeat, bw) for name in args.sets}
    iteration = {name: iteration_rows(SETS[name](), args.repeat, bw) for name in args.sets}
    clipped = {name: clipped_iteration_row(SETS[name](), args.repeat, bw) for name in args.sets}

    print(f"\n{'unscale + inf check':<18}{'tensors':>8}{'elements':>10}{'floor':>8}{'torch kernel':>13}"
          f"{'torch unscale_':>15}{'ampc unscale_':>14}{'vs kernel':>10}{'vs unscale_':>12}{'of floor':>9}"
          f"{'ampc wall':>10}")
    for name, r in unscale.items():
        ours = r["ampc_unscale"][0]
        print(f"{name:<18}{r['tensors']:>8}{r['n'] / 1e6:>9.1f}M{r['floor8']:>8.3f}{r['kernel'][0]:>13.3f}"
              f"{r['torch_unscale'][0]:>15.3f}{ours:>14.3f}{r['kernel'][0] / ours:>9.2f}x"
              f"{r['torch_unscale'][0] / ours:>11.2f}x{100 * r['floor8'] / ours:>8.0f}%{r['ampc_unscale'][1]:>10.3f}")

    print(f"\n{'unscale + clip':<18}{'floor':>8}{'torch recipe':>13}{'ampc fused':>11}{'speed-up':>9}"
          f"{'of floor':>9}{'torch wall':>11}{'ampc wall':>10}"
          f"{'floor 4B':>9}{'defer=True':>11}{'speed-up':>9}{'of floor':>9}")
    for name, r in unscale.items():
        t, o, d = r["torch_clip"], r["ampc_clip"], r["ampc_deferred"]
        print(f"{name:<18}{r['floor12']:>8.3f}{t[0]:>13.3f}{o[0]:>11.3f}{t[0] / o[0]:>8.2f}x"
              f"{100 * r['floor12'] / o[0]:>8.0f}%{t[1]:>11.3f}{o[1]:>10.3f}"
              f"{r['floor4']:>9.3f}{d[0]:>11.3f}{t[0] / d[0]:>8.2f}x{100 * r['floor4'] / d[0]:>8.0f}%")
    print("(defer=True only reads the gradients; the optimizer's fused step divides them, see the last table)")

    print(f"\n{'whole iteration':<18}{'optimizer':>12}{'floor':>8}{'torch':>8}{'ampc':>8}{'speed-up':>9}"
          f"{'of floor':>9}{'torch wall':>11}{'ampc wall':>10}{'wall x':>7}")
    for name, rows in iteration.items():
        for opt, r in rows.items():
            t, o = r["torch"], r["ampc"]
            label = ("SGD foreach" if opt == "SGD" else "AdamW fused")
            print(f"{name:<18}{label:>12}{r['floor']:>8.3f}{t[0]:>8.3f}{o[0]:>8.3f}{t[0] / o[0]:>8.2f}x"
                  f"{100 * r['floor'] / o[0]:>8.0f}%{t[1]:>11.3f}{o[1]:>10.3f}{t[1] / o[1]:>6.2f}x")
    print("(torch's optimizer named; ampc's is always its fused SGD or AdamW)")

    print(f"\n{'iteration, clip':<18}{'torch':>8}{'floor':>8}{'ampc':>8}{'speed-up':>9}{'of floor':>9}"
          f"{'floor':>8}{'deferred':>9}{'speed-up':>9}{'of floor':>9}")
    for name, r in clipped.items():
        t, e, d = r["torch"][0], r["eager"][0], r["deferred"][0]
        print(f"{name:<18}{t:>8.3f}{r['floor_eager']:>8.3f}{e:>8.3f}{t / e:>8.2f}x{100 * r['floor_eager'] / e:>8.0f}%"
              f"{r['floor_deferred']:>8.3f}{d:>9.3f}{t / d:>8.2f}x{100 * r['floor_deferred'] / d:>8.0f}%")
    print("(AdamW: torch's GradScaler + unscale_ + clip_grad_norm_(foreach) + AdamW(fused) against ampc's "
          "GradScaler + ampc.optim.AdamW with unscale_(max_norm=1.0), eager and defer=True)")


if __name__ == "__main__":
    main()
