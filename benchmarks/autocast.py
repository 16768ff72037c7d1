"""What autocast costs on the host: entering and leaving a region, and the time it adds to each
op it dispatches, against torch.autocast measured in the same run where torch is installed.

    python benchmarks/autocast.py [--calls N] [--rounds N]

1. Region: ``with autocast("cpu"): pass`` (construct, enter, exit, as a training loop writes
   it), and entering an instance made once (a decorator's case).
2. Dispatch on the CPU: a small registered op (it returns its first argument) on two 8x8
   NumPy arrays, called bare, registered but outside a region, and inside a region where
   nothing needs casting (the engine's own cost); then inside a region with one float32
   input to cast and a float32 Parameter whose cast comes from the cache.
3. With torch (CPU, and CUDA where there is a GPU): torch's F.linear on a 64x64 input with
   a 64x64 weight (spec/anchors.md's case), 5000 calls: no autocast, inside torch.autocast,
   and inside ampc.autocast with F.linear registered as ampc's "linear" op (the weight an
   ampc.Parameter, cast once per region as torch caches it). The added cost of each engine
   is its time minus the no-autocast time; the ratio is torch's added cost over ampc's.
   Each loop of 5000 calls runs in one region (the weight cast once, as in a forward pass) and
   waits for the GPU at its end only, so launch-bound ops show the host's cost.

Each row's loop runs once per round, the rows of a table in turn (interleaved, so a slow moment
of a shared host hits them alike); the best of --rounds after a warm-up; microseconds per call.
"""

import argparse
import contextlib
import time

import numpy as np

import ampc


def per_call_us(fns, calls, rounds, sync=None, regions=None):
    """The best time a call of each of fns, their loops interleaved round by round; regions[i],
    if given, is entered around fns[i]'s loop (a forward pass's region holds many ops)."""
    regions = regions or [None] * len(fns)

    def loop(fn, region):
        t0 = time.perf_counter()
        with region or contextlib.nullcontext():
            for _ in range(calls):
                fn()
        if sync:
            sync()
        return (time.perf_counter() - t0) / calls * 1e6

    for fn, region in zip(fns, regions):  # warm-up
        loop(fn, region)
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        best = [min(b, loop(fn, region)) for b, fn, region in zip(best, fns, regions)]
    return best


def region_rows(calls, rounds, torch):
    def ampc_region():
        with ampc.autocast("cpu"):
            pass

    made = ampc.autocast("cpu")

    def ampc_reentered():
        with made:
            pass

    names = ["ampc.autocast('cpu'): construct, enter, exit", "ampc: enter and exit an existing region"]
    fns = [ampc_region, ampc_reentered]
    if torch is not None:
        def torch_region():
            with torch.autocast("cpu"):
                pass

        made_torch = torch.autocast("cpu")

        def torch_reentered():
            with made_torch:
                pass

        names += ["torch.autocast('cpu'): construct, enter, exit", "torch: enter and exit an existing region"]
        fns += [torch_region, torch_reentered]
    return list(zip(names, per_call_us(fns, calls, rounds)))


def dispatch_rows(calls, rounds):
    def first(a, b):
        return a

    op = ampc.autocast_op("lower_precision_fp", name="benchmark_op")(first)
    low = np.ones((8, 8), ampc.bfloat16)
    high = np.ones((8, 8), np.float32)
    weight = ampc.Parameter(np.ones((8, 8), np.float32))
    region = ampc.autocast("cpu")
    bare, outside, nothing, cast_and_cached = per_call_us(
        [lambda: first(low, low), lambda: op(low, low), lambda: op(low, low), lambda: op(high, weight)],
        calls, rounds, regions=[None, None, region, region])
    return [("bare function", bare), ("autocast op outside a region", outside),
            ("inside a region, nothing to cast", nothing), ("inside, one input cast + a cached weight", cast_and_cached)]


def linear_rows(torch, device, calls, rounds):
    F = torch.nn.functional
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device)
    b = torch.randn(64, device=device)
    param = ampc.Parameter(w)
    linear = ampc.AutocastOp(F.linear, "linear")
    sync = torch.cuda.synchronize if device == "cuda" else None
    plain_time, torch_time, ampc_time = per_call_us(
        [lambda: F.linear(x, w, b), lambda: F.linear(x, w, b), lambda: linear(x, param, b)], calls, rounds, sync,
        regions=[None, torch.autocast(device), ampc.autocast(device)])
    with ampc.autocast(device):
        out = linear(x, param, b)
    with torch.autocast(device):
        expected = F.linear(x, w, b)
    assert out.dtype == expected.dtype and torch.equal(out, expected), "ampc and torch disagree"
    return plain_time, torch_time, ampc_time


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        torch = None

    print(f"ampc {ampc.__version__}" + (f", torch {torch.__version__}" if torch else ", no torch"))
    print("\n| region | us |\n| --- | --- |")
    for name, us in region_rows(args.calls * 4, args.rounds, torch):
        print(f"| {name} | {us:.2f} |")

    print("\n| CPU dispatch (8x8 NumPy arrays) | us a call | added to the bare function | added to the op outside "
          "a region |\n| --- | --- | --- | --- |")
    (bare_name, bare), *rows = dispatch_rows(args.calls * 4, args.rounds)
    outside = rows[0][1]
    print(f"| {bare_name} | {bare:.3f} | | |")
    for name, us in rows:
        print(f"| {name} | {us:.3f} | {us - bare:.3f} | {us - outside:.3f} |")

    if torch is None:
        return
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and ampc.cuda.is_available() else [])
    print("\n| F.linear 64x64 | no autocast us | torch.autocast us | ampc.autocast us | torch adds | ampc adds "
          "| torch / ampc added |\n| --- | --- | --- | --- | --- | --- | --- |")
    for device in devices:
        plain, torch_time, ampc_time = linear_rows(torch, device, args.calls, args.rounds)
        torch_added, ampc_added = torch_time - plain, ampc_time - plain
        ratio = torch_added / ampc_added if ampc_added > 0 else float("inf")
        print(f"| {device} | {plain:.2f} | {torch_time:.2f} | {ampc_time:.2f} | {torch_added:.2f} | "
              f"{ampc_added:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
