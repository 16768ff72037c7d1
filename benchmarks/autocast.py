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
   Each loop waits for the GPU at its end only, so launch-bound ops show the host's cost.

Median of --rounds, after a warm-up round; times in microseconds per call.
"""

import argparse
import statistics
import time

import numpy as np

import ampc


def per_call_us(fn, calls, rounds, sync=None):
    def loop():
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if sync:
            sync()
        return (time.perf_counter() - t0) / calls * 1e6

    loop()
    return statistics.median(loop() for _ in range(rounds))


def region_rows(calls, rounds, torch):
    def ampc_region():
        with ampc.autocast("cpu"):
            pass

    made = ampc.autocast("cpu")

    def ampc_reentered():
        with made:
            pass

    rows = [("ampc.autocast('cpu'): construct, enter, exit", per_call_us(ampc_region, calls, rounds)),
            ("ampc: enter and exit an existing region", per_call_us(ampc_reentered, calls, rounds))]
    if torch is not None:
        def torch_region():
            with torch.autocast("cpu"):
                pass

        made_torch = torch.autocast("cpu")

        def torch_reentered():
            with made_torch:
                pass

        rows += [("torch.autocast('cpu'): construct, enter, exit", per_call_us(torch_region, calls, rounds)),
                 ("torch: enter and exit an existing region", per_call_us(torch_reentered, calls, rounds))]
    return rows


def dispatch_rows(calls, rounds):
    def first(a, b):
        return a

    op = ampc.autocast_op("lower_precision_fp", name="benchmark_op")(first)
    low = np.ones((8, 8), ampc.bfloat16)
    high = np.ones((8, 8), np.float32)
    weight = ampc.Parameter(np.ones((8, 8), np.float32))
    bare = per_call_us(lambda: first(low, low), calls, rounds)
    outside = per_call_us(lambda: op(low, low), calls, rounds)
    with ampc.autocast("cpu"):
        inside = per_call_us(lambda: op(low, low), calls, rounds)
        cast_and_cached = per_call_us(lambda: op(high, weight), calls, rounds)
    return [("bare function", bare), ("autocast op outside a region", outside),
            ("inside a region, nothing to cast", inside), ("inside, one input cast + a cached weight", cast_and_cached)]


def linear_rows(torch, device, calls, rounds):
    F = torch.nn.functional
    x = torch.randn(64, 64, device=device)
    w = torch.randn(64, 64, device=device)
    b = torch.randn(64, device=device)
    param = ampc.Parameter(w)
    linear = ampc.AutocastOp(F.linear, "linear")
    sync = torch.cuda.synchronize if device == "cuda" else None
    plain = per_call_us(lambda: F.linear(x, w, b), calls, rounds, sync)
    with torch.autocast(device):
        torch_time = per_call_us(lambda: F.linear(x, w, b), calls, rounds, sync)
    with ampc.autocast(device):
        ampc_time = per_call_us(lambda: linear(x, param, b), calls, rounds, sync)
        out = linear(x, param, b)
    with torch.autocast(device):
        expected = F.linear(x, w, b)
    assert out.dtype == expected.dtype and torch.equal(out, expected), "ampc and torch disagree"
    return plain, torch_time, ampc_time


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
