"""The host's time per op call, ampc against torch, on operands small enough (8 x 64) that the kernel
is nothing and what is timed is the call: argument parsing, the tape's and autocast's wrappers, the
import of each operand through DLPack and the export of the result, the pool and the launch. On a GPU
an op whose kernel takes less than this is bound by the host (benchmarks/ops.py's small rows), which a
training step hides only while the host runs ahead.

    python benchmarks/host_time.py [--device cpu|cuda] [--numpy]

µs a call, the best of 5 runs of --calls calls, one thread; on CUDA each run ends in a synchronize, so
a call that waited for the GPU would show.
"""

import argparse
import time

import torch

import ampc

F = ampc.nn.functional
TF = torch.nn.functional


def per_call(fn, calls, synchronize):
    for _ in range(100):
        fn()
    synchronize()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
        synchronize()
    return best * 1e6


def cases(device, numpy):
    """(name, ampc's call, torch's call) on operands of device; with numpy, ampc's on NumPy copies."""
    def randn(*shape):
        return torch.randn(*shape, device=device)

    x, w, b, weight = randn(8, 64), randn(64), randn(64), randn(64, 64)
    target = torch.randint(0, 64, (8,), device=device)
    images, mean, var = randn(8, 16, 4, 4), torch.zeros(16, device=device), torch.ones(16, device=device)
    scale, shift = randn(16), randn(16)
    if numpy:
        x_, w_, b_, weight_, target_, images_, mean_, var_, scale_, shift_ = (
            v.cpu().numpy() for v in (x, w, b, weight, target, images, mean, var, scale, shift))
    else:
        x_, w_, b_, weight_, target_, images_, mean_, var_, scale_, shift_ = (
            x, w, b, weight, target, images, mean, var, scale, shift)
    array = ampc.from_dlpack(x)
    return [
        ("relu", lambda: F.relu(x_), lambda: TF.relu(x)),
        ("add", lambda: F.add(x_, x_), lambda: torch.add(x, x)),
        ("softmax", lambda: F.softmax(x_, dim=-1), lambda: TF.softmax(x, dim=-1)),
        ("layer_norm", lambda: F.layer_norm(x_, (64,), w_, b_), lambda: TF.layer_norm(x, (64,), w, b)),
        ("linear", lambda: F.linear(x_, weight_, b_), lambda: TF.linear(x, weight, b)),
        ("cross_entropy", lambda: F.cross_entropy(x_, target_), lambda: TF.cross_entropy(x, target)),
        ("batch_norm (train)", lambda: F.batch_norm(images_, mean_, var_, scale_, shift_, training=True),
         lambda: TF.batch_norm(images, mean, var, scale, shift, training=True)),
        ("import only", lambda: ampc.from_dlpack(x), lambda: torch.from_dlpack(x)),
        ("export only", lambda: torch.from_dlpack(array), lambda: x.view(8, 64)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--numpy", action="store_true", help="ampc's calls on NumPy arrays (--device cpu)")
    parser.add_argument("--calls", type=int, default=5000)
    args = parser.parse_args()
    if args.numpy and args.device != "cpu":
        parser.error("--numpy needs --device cpu")
    torch.set_num_threads(1)
    ampc.set_num_threads(1)
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    print(f"{args.device}{', ampc on NumPy arrays' if args.numpy else ''}: us a call")
    print(f"{'call':<20}{'ampc':>8}{'torch':>8}{'ratio':>7}")
    for name, ours, theirs in cases(args.device, args.numpy):
        a, t = per_call(ours, args.calls, synchronize), per_call(theirs, args.calls, synchronize)
        print(f"{name:<20}{a:8.2f}{t:8.2f}{t / a:7.2f}", flush=True)


if __name__ == "__main__":
    main()
